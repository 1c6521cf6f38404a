# shellcheck shell=bash
# ccache settings shared by scripts/build.sh and scripts/fuzz.sh. Source it from the repository
# root. Paths under the checkout are hashed relative to it (base_dir) and the build directory is
# not hashed (hash_dir off, although -g records it), so a second clone of the repository in
# another folder, as CI makes, reuses what an earlier build of the same sources compiled.
# Three builds (release, sanitizers, fuzz) need more than ccache's default 5 GB.
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$PWD}
export CCACHE_NOHASHDIR=${CCACHE_NOHASHDIR:-1}
export CCACHE_MAXSIZE=${CCACHE_MAXSIZE:-12G}
