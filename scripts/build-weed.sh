#!/usr/bin/env bash
# Builds SeaweedFS's `weed` (an S3-compatible server the export tests start
# on loopback) once per machine and caches it outside the repository.
#
#   bash scripts/build-weed.sh        # prints the binary's path
#
# The binary goes to ${TENURE_WEED_CACHE:-$HOME/.cache/tenure}/weed-<version>;
# a cached one is reused. The build takes 10-15 minutes on 2 cores and about
# 2 GB of module downloads the first time; it runs niced and is bounded by
# TENURE_WEED_BUILD_TIMEOUT (default 40m). `go install` refuses this module
# (its go.mod has replace directives), so the module is downloaded, copied
# and built in place.
set -euo pipefail

version=v0.0.0-20261109003541-7506e5f91cd6
cache=${TENURE_WEED_CACHE:-$HOME/.cache/tenure}
bin=$cache/weed-$version
if [[ -x $bin ]]; then
	echo "$bin"
	exit 0
fi
command -v go >/dev/null || export PATH="$PATH:/usr/local/go/bin"
mkdir -p "$cache"
limit=${TENURE_WEED_BUILD_TIMEOUT:-40m}
echo "build-weed: building SeaweedFS $version for the S3 export tests (once per machine, 10-15 minutes; bounded by $limit)" >&2
dir=$(cd "$cache" && timeout "$limit" go mod download -json "github.com/seaweedfs/seaweedfs@$version" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
if [[ -z $dir || ! -d $dir ]]; then
	echo "build-weed: could not download github.com/seaweedfs/seaweedfs@$version" >&2
	exit 1
fi
src=$(mktemp -d "$cache/weed-src.XXXXXX")
trap 'chmod -R u+w "$src" 2>/dev/null; rm -rf "$src"' EXIT
cp -r "$dir/." "$src/"
chmod -R u+w "$src"
start=$SECONDS
(cd "$src" && GOFLAGS=-buildvcs=false timeout "$limit" nice -n 10 go build -o "$bin.tmp" ./weed)
mv "$bin.tmp" "$bin"
echo "build-weed: built $bin in $((SECONDS - start))s" >&2
echo "$bin"
