#!/usr/bin/env bash
# Fails when a tracked C++ file is not clang-format clean (.clang-format: Google, 100 columns).
# With --fix, formats them in place instead.
set -euo pipefail
cd "$(dirname "$0")/.."
mapfile -t files < <(git ls-files '*.cc' '*.h' '*.cu')
[ ${#files[@]} -gt 0 ] || exit 0
if [ "${1:-}" = "--fix" ]; then
  clang-format -i "${files[@]}"
  exit 0
fi
if ! clang-format --dry-run -Werror "${files[@]}" 2>/tmp/railyard-format.$$; then
  echo "check-format: these files need clang-format (run scripts/check-format.sh --fix):"
  grep -o '^[^: ]*\.\(cc\|h\|cu\):[0-9]' /tmp/railyard-format.$$ | sed 's/:[0-9]$//' | sort -u |
    sed 's/^/  /'
  rm -f /tmp/railyard-format.$$
  exit 1
fi
rm -f /tmp/railyard-format.$$
echo "check-format: ${#files[@]} files clean"
