#!/usr/bin/env python3
"""Writes the inputs of the tokenizer checks against Hugging Face (tests/text/text.cmake) into this directory.

  adversarial.txt        valid UTF-8 that is hard to split the same way: combining marks and text NFC changes, emoji
                         ZWJ sequences, CJK, right-to-left scripts, every kind of white space and control character,
                         long runs of white space, digits and letters, contractions in capitals, added tokens' text
  empty.txt, space.txt   the empty text and a lone space
  invalid_utf8.bin       ill-formed UTF-8 between valid text: lone continuation bytes, overlong forms, surrogates,
                         code points above U+10FFFF, truncated sequences (one at the very end), 0xFE and 0xFF
  added_token_flags.txt  text around the extra added tokens of compare.js's added_token_flags variant

The files are committed; run this to regenerate them after changing it.
"""
import os

HERE = os.path.dirname(os.path.abspath(__file__))


def adversarial():
    parts = [
        # Combining marks, and text NFC composes or reorders.
        "e\u0301 a\u0300\u0301\u0302 \u0301start Z\u0351\u036b\u0343\u036a\u0302\u036b\u033d\u034f\u0334\u0319 "
        "Tie\u0302\u0301ng Vie\u0323\u0302t A\u030a \u212b \u1e9b\u0323 a\u0323\u0302 a\u0302\u0323 "
        "\u1100\u1161\u11a8 \u0915\u093c \u00e9\u0301 o\u0308\u0304 \u2126 \ufb01 \u0041\u0327\u0301\n",
        # Characters assigned after Unicode 9.0, which Hugging Face's NFC tables predate: a composition of Unicode 13
        # (U+11935 U+11930), a combining mark of Unicode 11 (U+08D3, class 220) out of canonical order, and letters
        # of Unicode 15 and 15.1 next to Latin ones.
        "\U00011935\U00011930 a\u0301\u08d3 a\u08d3\u0301 e\u08d3\u0301\u0323 a\U00031350b x\U00011f04y "
        "9\U00031350 a\U0002ebf0b\n",
        # Emoji: ZWJ sequences, skin tones, flags, keycaps, variation selectors.
        "\U0001f469\u200d\U0001f469\u200d\U0001f467\u200d\U0001f466 \U0001f468\U0001f3fd\u200d\U0001f4bb "
        "\U0001f3f3\ufe0f\u200d\U0001f308 \U0001f1e9\U0001f1ea\U0001f1ef\U0001f1f5 1\ufe0f\u20e3 \u2764\ufe0f "
        "\U0001f44d\U0001f3ff\U0001f44d\U0001f3fb x\U0001f600y \U0001f600\U0001f600\U0001f600\n",
        # CJK, fullwidth, Ext B, and letters of Unicode 15.0 (CJK Ext H, Kawi).
        "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8\u3001\u4e2d\u6587\u6587\u672c\u3002\ud55c\uad6d\uc5b4 "
        "\ud14d\uc2a4\ud2b8 \uff21\uff22\uff23\uff11\uff12\uff13 \U00020000\U00020001 \U00031350\U00031351 "
        "\U00011f04\U00011f05 \u3000\u3000\u6f22\u5b57\n",
        # Right to left, bidi controls, ZWNJ/ZWJ.
        "\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645 \u0661\u0662\u0663 "
        "\u06f4\u06f5\u06f6 \u05e9\u05c1\u05b8\u05dc\u05d5\u05b9\u05dd \u05e2\u05d5\u05b9\u05dc\u05b8\u05dd "
        "\u200f\u200e\u202a\u202c\u2067x\u2069 \u0645\u06cc\u200c\u062e\u0648\u0627\u0647\u0645 a\u200db\n",
        # Control characters and every White_Space character, alone and in runs.
        "a\r\nb\r\r\n\nc\td\x0be\x0cf\x00g\x01h\x1bi\x7fj\u0085k\u2028l\u2029m\u00a0n\u3000o\u180ep\u200bq"
        "\ufeffr\u1680s\u2007t\u202fu\u205fv\u2000w\u200ax\r y \r\n z \t\n\x0b\x0c\r\u0085\u2028\n",
        "\u00a0\u00a0\u00a0x a \u00a0 b \u00a0\u00a0 c\u00a0\u00a0\n \u00a0\n\u3000\u3000 \u3000x\n",
        # U+180E is White_Space for PCRE2's \s but not for Oniguruma's; U+0085 and U+2028 are White_Space for both.
        "x \u180ey \u180e\u180e z\u180e \u180e x\u180e\u180e! \u180e. (\u180e) x  \u180ey x   \u180e\u180e\n x \u0085y \u2028\u2028z \u0085\n",
        # Long white space: 1000 spaces (before a word, before a newline, at a line end), mixed tabs and newlines.
        " " * 1000 + "x\n" + " " * 1000 + "\n" + "y" + " " * 1000 + "\n" + "\t\n \t\n" * 200 + "\r\n" * 300,
        "\t" * 300 + "z" + "\n" * 300 + " \n" * 100 + "\u00a0" * 200 + "\u3000" * 100 + "end\n",
        # Digits: a long run (Llama 3 takes 1-3 at a time), grouped numbers, other scripts' digits, No and Nl.
        "1234567890" * 100 + "\n1 12 123 1234 12345 123456 1234567 12,345,678.90 -0.5e-10 0x1F 3rd 21st\n"
        "\u0663\u0664\u0665\u0666\u0667 \u0967\u0968\u0969 \u2460\u2461\u2462 \u216b \u00b2\u00b3 \uff11\uff12\n",
        # Contractions, in capitals and not, and the apostrophes around them.
        "DON'T 'S I'M YOU'RE WE'VE SHE'LL HE'D IT'S it's don't we'll 's 'S ''s 's' 'd'd 'll've "
        "Don\u2019t 'Ll 'lL 'Re 'VE '\u017f '\u212a x's 'T'S 'm\n",
        # Added tokens' text, whole, repeated, cut short and nested.
        "<|endoftext|> <|endoftext|><|endoftext|>x<|endoftext|> <|endoftext <|end<|endoftext|>|> "
        "<|begin_of_text|><|eot_id|><|start_header_id|>user<|end_header_id|> <|reserved_special_token_5|> "
        "<|im_start|>system\n<|im_end|> <tool_call></tool_call> <|fim_prefix|><|fim_middle|> <|im_start|\n",
        # Long words: the heap-based merge path.
        "a" * 5000 + " " + "ab" * 1000 + " " + "supercalifragilisticexpialidocious" * 30 + " "
        + "\u00e9" * 500 + " " + "\u65e5" * 300 + "\n",
        # Words that are one token of Llama 3's vocabulary but that its merges alone would split (ignore_merges).
        "vi\u1ec7c h\u1ee3p nhi\u1ec1u \u0111i\u1ec1u Vi\u1ec7t \u0627\u06cc\u0631\u0627\u0646 ngo\u00e0i "
        "de\u011fi\u015f \u0445\u0430\u0440\u0430\u043a\u0442\u0435\u0440 oldu\u011fu gelmektedir "
        "\u0432\u0438\u043a\u043e\u0440\u0438\u0441\u0442 olu\u015ftur\n.:.:.:.:.:.:.:.:x\n",
        # Mixed scripts and other text.
        "na\u00efve caf\u00e9 r\u00e9sum\u00e9 \u0395\u03bb\u03bb\u03b7\u03bd\u03b9\u03ba\u03ac "
        "\u041f\u0440\u0438\u0432\u0435\u0442 \u043c\u0438\u0440 \u0928\u092e\u0938\u094d\u0924\u0947 "
        "\u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35 \u0ba4\u0bae\u0bbf\u0bb4\u0bcd \u2211\u222b\u221a\u221e\u2260\u2264 "
        "x\u00b2+y\u00b2=z\u00b2 \ue000 \ufdd0 \ufffe \U0010ffff \ufffd\n",
        "https://example.com/a?b=c&d=e#f def f(x):\n\treturn x**2  # comment\n{\"key\": [1, 2.5e-3]}\n"
        "    indented\n\n\n\nfinal line without newline: !!! ??? ... --- ___ *** ### $$$ %%%",
    ]
    return "".join(parts)


def invalid_utf8():
    bad = [
        b"\x80", b"\xbf", b"\x80\x80\x80", b"\xc0\x80", b"\xc1\xbf", b"\xe0\x80\x80", b"\xe0\x9f\xbf",
        b"\xf0\x80\x80\x80", b"\xf0\x8f\xbf\xbf", b"\xed\xa0\x80", b"\xed\xbf\xbf", b"\xed\xa0\x80\xed\xb0\x80",
        b"\xf4\x90\x80\x80", b"\xf5\x80\x80\x80", b"\xf8\x88\x80\x80\x80", b"\xfc\x84\x80\x80\x80\x80", b"\xfe",
        b"\xff", b"\xff\xfe", b"\xe2\x82", b"\xf0\x9f\x98", b"\xc3", b"\xe2\x82\x41", b"\xf0\x9f\x41",
        b"\xc3\xc3\xa9", b"\xe2\xe2\x82\xac",
    ]
    out = b"valid \xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80 start\n"
    for i, b in enumerate(bad):
        out += b"word" + b + b"word " + b + b" " + b + b"\n" + b + str(i).encode() + b"\xc3\xa9" + b + b"\n"
    out += b"<|endoftext|>\xff<|im_end|>\n"
    out += b"end \xf0\x9f\x98"  # truncated at the very end
    return out


def added_token_flags():
    return (
        "a <L> b\na\u00a0\u3000<L>b\n<L>start\nx  <R>  y\n<R>\n\n z\np <LR> q\n<LR>\n  <LR>\t\n"
        "word\na word b\npassword\nwords\nword_x\nword.\n\u00e9word\nword1\n1word\n-word-\n"
        "cafe\u0301 caf\u00e9 CAF\u00c9 cafe\u0301s\n\u212b \u00c5 A\u030a\nx\u0301y x\u0301 y xy\n"
        "<L><L>  <R><R>  <L>\n<|endoftext|> <|im_end|><L>\n"
    )


def main():
    with open(os.path.join(HERE, "adversarial.txt"), "w", encoding="utf-8", newline="") as f:
        f.write(adversarial())
    with open(os.path.join(HERE, "empty.txt"), "wb") as f:
        f.write(b"")
    with open(os.path.join(HERE, "space.txt"), "wb") as f:
        f.write(b" ")
    with open(os.path.join(HERE, "invalid_utf8.bin"), "wb") as f:
        f.write(invalid_utf8())
    with open(os.path.join(HERE, "added_token_flags.txt"), "w", encoding="utf-8", newline="") as f:
        f.write(added_token_flags())


if __name__ == "__main__":
    main()
