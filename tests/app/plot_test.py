#!/usr/bin/env python3
"""`shardtrain plot` end to end, the SVG read back as XML.

  plot_test.py SHARDTRAIN WORKDIR
      a hand-written metrics file (a resumed run's repeated steps, a null loss, evaluations): the SVG is well-formed
      and self-contained, has the 4 panels, the loss polyline has one point per distinct step with a loss (the last
      record of a repeated step) at the pixel the panel's data range gives; bad files exit 2 naming file and line.
      Two files drawn together: each run's loss under its file's stem, in a colour of its own.
  plot_test.py SHARDTRAIN WORKDIR MPIRUN CONFIG
      trains CONFIG for a few steps on 2 MPI ranks with log.metrics, checks the new JSONL fields (mem_peak_bytes has
      one entry > 0 per rank, skipped_total counts a step skipped on purpose, comm_exposed_ms), then plots the file.
"""
import json
import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET

NS = "{http://www.w3.org/2000/svg}"
PANELS = ["panel-loss", "panel-tokens_per_s", "panel-lr", "panel-grad_norm"]


def run(cmd, **kw):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)
    return p.returncode, p.stdout


def check(cond, what):
    if not cond:
        print("FAIL:", what)
        sys.exit(1)


def polyline_points(panel, series):
    lines = [e for e in panel.iter(NS + "polyline") if e.get("data-series") == series]
    check(len(lines) == 1, f"{panel.get('id')}: one polyline for {series}, got {len(lines)}")
    return [tuple(float(v) for v in p.split(",")) for p in lines[0].get("points").split()]


def read_svg(path):
    """Parses the SVG (raises on malformed XML) and checks what every plot must be."""
    root = ET.parse(path).getroot()
    check(root.tag == NS + "svg", f"root element {root.tag}")
    title = root.find(NS + "title")
    check(title is not None and title.text.startswith("shardtrain metrics: "), "a <title>")
    for e in root.iter():
        check(e.tag != NS + "script" and e.tag != NS + "style" and e.tag != NS + "image", f"no <{e.tag}>")
        for k, v in e.attrib.items():
            check("href" not in k and "url(" not in v, f"no external reference ({k}={v})")
    panels = [g for g in root.iter(NS + "g") if g.get("class") == "panel"]
    check([g.get("id") for g in panels] == PANELS, f"4 panels {PANELS}, got {[g.get('id') for g in panels]}")
    for g in panels:
        labels = [t.text for t in g.iter(NS + "text")]
        check(len(labels) >= 6, f"{g.get('id')}: a title, axis labels and ticks (got {labels})")
    return {g.get("id"): g for g in panels}


def check_mapping(panel, series, values):
    """The polyline of `series` has one point per (step, value), each where the panel's range puts it."""
    pts = polyline_points(panel, series)
    check(len(pts) == len(values), f"{series}: {len(values)} points, got {len(pts)}")
    f = {k: float(panel.get("data-" + k)) for k in ["x0", "x1", "y0", "y1", "xmin", "xmax", "ymin", "ymax"]}
    ys = [v for _, v in values]
    check(f["ymin"] <= min(ys) and max(ys) <= f["ymax"], f"{series}: range {f['ymin']}..{f['ymax']} covers the data")
    for (step, v), (px, py) in zip(values, pts):
        ex = f["x0"] + (step - f["xmin"]) / (f["xmax"] - f["xmin"]) * (f["x1"] - f["x0"])
        ey = f["y0"] - (v - f["ymin"]) / (f["ymax"] - f["ymin"]) * (f["y0"] - f["y1"])
        check(abs(px - ex) <= 0.006 and abs(py - ey) <= 0.006, f"{series} step {step}: ({px}, {py}) vs ({ex}, {ey})")
    lo = min(range(len(ys)), key=lambda i: ys[i])
    hi = max(range(len(ys)), key=lambda i: ys[i])
    check(pts[lo][1] == max(p[1] for p in pts), f"{series}: the smallest value is the lowest point")
    check(pts[hi][1] == min(p[1] for p in pts), f"{series}: the largest value is the highest point")
    return pts


def expect_bad_input(shardtrain, args, pattern):
    rc, out = run([shardtrain, "plot"] + args)
    check(rc == 2, f"plot {args}: exit 2, got {rc}: {out}")
    check(pattern in out, f"plot {args}: '{pattern}' in the output: {out}")


def hand_written(shardtrain, work):
    metrics = os.path.join(work, "run.jsonl")
    rec = lambda step, loss, **kw: json.dumps(dict(step=step, loss=loss, lr=1e-3 * step, grad_norm=0.5,
                                                  tokens_per_s=1000.0 + step, **kw))
    lines = [rec(1, 5.5), rec(2, 4.75), rec(3, 4.5), rec(4, 4.4),
             json.dumps({"step": 4, "val_loss": 4.6}),
             rec(3, 4.25), rec(4, 4.0),  # resumed from the checkpoint at step 2: steps 3 and 4 again
             rec(5, None, skipped=True),  # a non-finite loss, written as null
             rec(6, 3.5), "", json.dumps({"step": 6, "val_loss": 3.75})]
    with open(metrics, "w") as f:
        f.write("\n".join(lines) + "\n")
    out_svg = os.path.join(work, "out.svg")
    rc, out = run([shardtrain, "plot", metrics, "--out", out_svg])
    check(rc == 0, f"plot exits 0, got {rc}: {out}")
    check("6 steps (1-6), 5 loss and 2 val_loss points" in out and "2 step(s) appear more than once" in out, out)
    panels = read_svg(out_svg)
    check_mapping(panels["panel-loss"], "loss", [(1, 5.5), (2, 4.75), (3, 4.25), (4, 4.0), (6, 3.5)])
    check_mapping(panels["panel-loss"], "val_loss", [(4, 4.6), (6, 3.75)])
    check_mapping(panels["panel-lr"], "lr", [(s, 1e-3 * s) for s in range(1, 7)])
    check_mapping(panels["panel-tokens_per_s"], "tokens_per_s", [(s, 1000.0 + s) for s in range(1, 7)])
    # The default output: the metrics file with the extension .svg.
    rc, out = run([shardtrain, "plot", metrics])
    check(rc == 0 and os.path.exists(os.path.join(work, "run.svg")), f"default --out run.svg: {out}")

    bad = os.path.join(work, "bad.jsonl")
    with open(bad, "w") as f:
        f.write(rec(1, 5.0) + "\n" + rec(2, 4.0)[:-1] + "\n")  # line 2 cut short, as by a killed writer
    expect_bad_input(shardtrain, [bad], bad + ":2: not a JSON object")
    empty = os.path.join(work, "empty.jsonl")
    open(empty, "w").close()
    expect_bad_input(shardtrain, [empty], empty + ' has no records with a "step"')
    nosteps = os.path.join(work, "nosteps.jsonl")
    with open(nosteps, "w") as f:
        f.write('{"loss": 1}\n')
    expect_bad_input(shardtrain, [nosteps], nosteps + ' has no records with a "step"')
    expect_bad_input(shardtrain, [os.path.join(work, "missing.jsonl")], "cannot open metrics file")
    expect_bad_input(shardtrain, [], "no metrics file given")
    expect_bad_input(shardtrain, [metrics, "--outt=x.svg"], "unknown option '--outt=x.svg'")
    nodir = os.path.join(work, "no-such-dir", "x.svg")
    expect_bad_input(shardtrain, [metrics, "--out=" + nodir],
                     "plot --out " + nodir + ": output directory " + os.path.dirname(nodir) + " does not exist")
    # Two runs over each other: each run's series named by its file's stem, a colour a run, mapped in one range.
    other = os.path.join(work, "fp8.jsonl")
    with open(other, "w") as f:
        f.write("\n".join(rec(step, loss) for step, loss in [(1, 5.25), (2, 4.5), (3, 6.0)]) + "\n")
    both = os.path.join(work, "both.svg")
    rc, out = run([shardtrain, "plot", metrics, other, "--out", both])
    check(rc == 0 and "fp8.jsonl: 3 steps (1-3), 3 loss and 0 val_loss points" in out, f"plot of two runs: {out}")
    panels = read_svg(both)
    check_mapping(panels["panel-loss"], "run loss", [(1, 5.5), (2, 4.75), (3, 4.25), (4, 4.0), (6, 3.5)])
    check_mapping(panels["panel-loss"], "fp8 loss", [(1, 5.25), (2, 4.5), (3, 6.0)])
    colors = {e.get("data-series"): e.get("stroke") for e in panels["panel-loss"].iter(NS + "polyline")}
    check(colors["run loss"] != colors["fp8 loss"], f"a colour a run: {colors}")
    expect_bad_input(shardtrain, [metrics, other], "2 metrics files need --out FILE.svg")
    print("ok: plot of a hand-written file: 4 panels, 5 loss points mapped, errors exit 2 with file and line; two "
          "runs over each other")


def trained(shardtrain, work, mpirun, config):
    metrics = os.path.join(work, "mpi.jsonl")
    cmd = [mpirun, "--oversubscribe", "-np", "2", "--bind-to", "none", "--mca", "btl", "self,vader", shardtrain,
           "train", "--config", config, "--train.steps=3", "--train.global_batch=4", "--train.micro_batch=2",
           "--train.eval_every=2", "--train.eval_batches=1", "--train.sample_tokens=0", "--log.metrics=" + metrics]
    # Rank 1's gradients of step 2 become infinite: every rank skips that step.
    rc, out = run(cmd, env=dict(os.environ, SHARDTRAIN_FAULT="grad_inf:1@2"))
    check(rc == 0, f"train exits 0, got {rc}: {out}")
    records = [json.loads(line) for line in open(metrics)]
    steps = [r for r in records if "loss" in r]
    check([r["step"] for r in steps] == [1, 2, 3], f"step records 1-3: {[r['step'] for r in steps]}")
    check([r["step"] for r in records if "val_loss" in r] == [2, 3], "evaluations at steps 2 and 3")
    check([r["skipped"] for r in steps] == [False, True, False], f"step 2 skipped: {[r['skipped'] for r in steps]}")
    check([r["skipped_total"] for r in steps] == [0, 1, 1], f"skipped_total: {[r['skipped_total'] for r in steps]}")
    for r in steps:
        mem = r["mem_peak_bytes"]
        check(isinstance(mem, list) and len(mem) == 2 and all(isinstance(b, int) and b > (1 << 20) for b in mem),
              f"step {r['step']}: mem_peak_bytes has 2 entries > 1 MiB: {mem}")
        check(r["comm_exposed_ms"] >= 0, f"step {r['step']}: comm_exposed_ms {r['comm_exposed_ms']}")
    for a, b in zip(steps, steps[1:]):
        check(all(y >= x for x, y in zip(a["mem_peak_bytes"], b["mem_peak_bytes"])), "peaks never decrease")
    out_svg = os.path.join(work, "mpi.svg")
    rc, out = run([shardtrain, "plot", metrics, "--out", out_svg])
    check(rc == 0, f"plot exits 0, got {rc}: {out}")
    panels = read_svg(out_svg)
    check_mapping(panels["panel-loss"], "loss", [(r["step"], r["loss"]) for r in steps if r["loss"] is not None])
    check(len(polyline_points(panels["panel-loss"], "val_loss")) == 2, "2 val_loss points")
    print(f"ok: 2 ranks, 3 steps: mem_peak_bytes {steps[-1]['mem_peak_bytes']}; the plot parses with 3 loss points")


def main():
    shardtrain, work = sys.argv[1:3]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    if len(sys.argv) > 3:
        trained(shardtrain, work, sys.argv[3], sys.argv[4])
    else:
        hand_written(shardtrain, work)


if __name__ == "__main__":
    main()
