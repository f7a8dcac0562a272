#!/usr/bin/env bash
# Shows that the numeric bars still catch the bugs they exist for. For each tests/mutations/*.patch: applies the
# mutation to a copy of this working tree, rebuilds the CPU backend, runs the tests its "Expect to fail:" line
# names (a ctest -R regex) and prints each test's verdict with its first failure line. Exits 1 if any named test
# passes under its mutation. Not part of ctest: it rebuilds once per mutation (about 40 minutes on 2 cores).
#
# usage: tests/mutations/run.sh [WORKDIR]        (default WORKDIR: build-mutations, under the repository root)
# environment: OPENBLAS_CORETYPE and the like pass through to the tests.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mkdir -p "${1:-$root/build-mutations}" && cd "${1:-$root/build-mutations}" && pwd)
src=$work/src
build=$work/build

# A plain copy (tracked and untracked, not ignored, files), so uncommitted changes are mutated too.
rm -rf "$src"
mkdir -p "$src"
git -C "$root" ls-files -z --cached --others --exclude-standard | tar -C "$root" --null -T - -cf - | tar -C "$src" -xf -
launcher=()
if command -v ccache >/dev/null; then
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
fi
cmake -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=Release -DSHARDTRAIN_CUDA=OFF "${launcher[@]}" >"$work/cmake.log" 2>&1

status=0
summary=()
for patch in "$root"/tests/mutations/*.patch; do
  name=$(basename "$patch" .patch)
  regex=$(sed -n 's/^Expect to fail: //p' "$patch")
  echo "== $name: $(sed -n 's/^Mutation: //p' "$patch")"
  patch -d "$src" -p1 --quiet <"$patch"
  if ! cmake --build "$build" -j"$(nproc)" >"$work/$name.build.log" 2>&1; then
    patch -d "$src" -p1 -R --quiet <"$patch"
    echo "   build failed: $work/$name.build.log"
    status=1
    continue
  fi
  ctest --test-dir "$build" -R "$regex" -j2 --output-on-failure >"$work/$name.log" 2>&1 || true
  patch -d "$src" -p1 -R --quiet <"$patch"
  ran=$(grep -cE '^ *[0-9]+/[0-9]+ Test +#' "$work/$name.log" || true)
  failed=$(grep -cE '^ *[0-9]+/[0-9]+ Test +#.*\*\*\*(Failed|Exception)' "$work/$name.log" || true)
  grep -E '^ *[0-9]+/[0-9]+ Test +#' "$work/$name.log" | sed 's/^/   /'
  # Each parity test's worst error / bar per quantity (under 1 passes), and how many quantities broke their bars.
  grep -E '^(error / bar|FAILED:)' "$work/$name.log" | cut -c1-240 | sed 's/^/     /' || true
  summary+=("$name: $failed of $ran named tests failed")
  if [ "$ran" -eq 0 ] || [ "$failed" -ne "$ran" ]; then
    status=1
  fi
done
printf '%s\n' "${summary[@]}"
exit $status
