#!/usr/bin/env bash
# Runs clang-tidy (.clang-tidy) over the project's own sources using build/compile_commands.json.
# Slow on 2 cores (gRPC headers): run it before sending a change, not in every CI run.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -f build/compile_commands.json ] || scripts/build.sh
mapfile -t files < <(git ls-files 'daemon/*.cc' 'client/*.cc' 'tools/*.cc')
clang-tidy -p build --quiet "${files[@]}"
