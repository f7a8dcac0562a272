// The names of an enum's values, in one table per enum. Everything that spells a value reads the table: to_string(),
// the config's parsing and its error for a value not in the table, and the choices `shardtrain --help` and
// docs/config.md list. A new value, or a new enum-valued config key, is then one edit here and one key in
// src/core/config_keys.cc:
//
//   enum class Fp8Recipe { kTensorwise, kRowwise };
//   template <>
//   struct EnumNames<Fp8Recipe> {
//     static constexpr EnumName<Fp8Recipe> kList[] = {{Fp8Recipe::kTensorwise, "tensorwise"},
//                                                     {Fp8Recipe::kRowwise, "rowwise"}};
//   };
//   to_string(Fp8Recipe::kRowwise);  // "rowwise"
//
// Each value has one name and each name one value; the list's order is the order help and errors show them in.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <type_traits>

namespace st {

template <typename E>
struct EnumName {
  E value;
  const char* name;
};

// Specialised for each named enum with `static constexpr EnumName<E> kList[]`; the primary has no list.
template <typename E>
struct EnumNames {};

template <typename E, typename = void>
inline constexpr bool kHasEnumNames = false;
template <typename E>
inline constexpr bool kHasEnumNames<E, std::void_t<decltype(EnumNames<E>::kList)>> = true;

// The value's name; "?" for a value outside the table (a cast from a number).
template <typename E, typename = std::enable_if_t<kHasEnumNames<E>>>
constexpr const char* to_string(E value) {
  for (const EnumName<E>& n : EnumNames<E>::kList)
    if (n.value == value) return n.name;
  return "?";
}

// The value named `name` exactly (case matters), or nothing.
template <typename E, typename = std::enable_if_t<kHasEnumNames<E>>>
constexpr std::optional<E> enum_from_name(std::string_view name) {
  for (const EnumName<E>& n : EnumNames<E>::kList)
    if (name == n.name) return n.value;
  return std::nullopt;
}

// "a, b, c": every name in table order, for help and error messages.
template <typename E, typename = std::enable_if_t<kHasEnumNames<E>>>
std::string enum_name_list() {
  std::string out;
  for (const EnumName<E>& n : EnumNames<E>::kList) out += (out.empty() ? "" : ", ") + std::string(n.name);
  return out;
}

}  // namespace st
