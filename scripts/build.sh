#!/usr/bin/env bash
# Configures and builds slimquant in ./build (Release), then makes `import slimquant` work for
# Debian's /usr/bin/python3: a slimquant.pth file in its site-packages (/usr/local/lib/python3.X/
# dist-packages when writable, as for root in CI; the user's site-packages otherwise) names
# build/python, where the package is built. docs/python.md: other environments.
set -euo pipefail
cd "$(dirname "$0")/.."
# Ninja when installed (scripts/install-deps.sh installs it): it schedules every target's objects as
# one graph, where make finishes each target before starting those that depend on it and leaves a
# core idle at each boundary. A build folder configured earlier keeps its generator (CMake refuses
# to change it).
generator=()
if [ ! -f build/CMakeCache.txt ] && command -v ninja >/dev/null 2>&1; then generator=(-G Ninja); fi
cmake -S . -B build "${generator[@]}" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)"  # nproc honours OMP_NUM_THREADS

if [ -f build/python/slimquant/__init__.py ] && [ -x /usr/bin/python3 ]; then
  site_dir=$(/usr/bin/python3 -c 'import site; print(site.getsitepackages()[0])')
  if ! { mkdir -p "$site_dir" 2>/dev/null && [ -w "$site_dir" ]; }; then
    site_dir=$(/usr/bin/python3 -m site --user-site)
    mkdir -p "$site_dir"
  fi
  echo "$PWD/build/python" >"$site_dir/slimquant.pth"
  /usr/bin/python3 -c 'import slimquant' ||
    { echo "error: /usr/bin/python3 cannot import slimquant after the build (see $site_dir/slimquant.pth)" >&2; exit 1; }
  echo "python: /usr/bin/python3 imports slimquant from $PWD/build/python ($site_dir/slimquant.pth)"
fi
