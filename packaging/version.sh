#!/bin/sh
# Prints the version of the tree being built, for -ldflags and the .deb.
#
#   version.sh        git describe of the newest v* tag, without the "v":
#                     1.2.0, 1.2.0-3-gabc1234, 1.2.0-3-gabc1234-dirty;
#                     before the first tag 0.0.0-<commits>-g<hash>[-dirty]
#   version.sh deb    the same as a Debian version that sorts in build
#                     order: 1.2.0, 1.2.0+git3.gabc1234[.dirty]
#
# Outside a git checkout it prints the VERSION file's line, if any, else
# nothing (the binaries then fall back to Go's build information).
set -eu
cd "$(dirname "$0")/.."

describe() {
	if d=$(git describe --tags --match 'v[0-9]*' --dirty 2>/dev/null); then
		echo "${d#v}"
	elif n=$(git rev-list --count HEAD 2>/dev/null); then
		h=$(git rev-parse --short=7 HEAD)
		dirty=$(git diff --quiet HEAD 2>/dev/null || echo -dirty)
		echo "0.0.0-$n-g$h$dirty"
	elif [ -f VERSION ]; then
		head -n 1 VERSION
	fi
}

v=$(describe)
case "${1:-}" in
deb)
	[ -n "$v" ] || v=0.0.0
	# base-N-gHASH[-dirty] -> base+gitN.gHASH[.dirty]
	echo "$v" | sed -E 's/^([^-]+)-([0-9]+)-(g[0-9a-f]+)/\1+git\2.\3/; s/-dirty$/.dirty/'
	;;
*) echo "$v" ;;
esac
