#!/bin/sh
# Installs or uninstalls hagroup; `make install` / `make uninstall` run it
# with the directories below set (see the Makefile for their defaults).
#
#   install.sh install     copy the built files into $DESTDIR, recording
#                          each in $DOCDIR/MANIFEST
#   install.sh uninstall   remove every file the MANIFEST lists
#
# The configuration $SYSCONFDIR/hagroup/hagroup.toml is installed only when
# absent and INSTALL_CONFIG=yes, and never removed: it is the operator's.
set -eu

: "${BIN:?}" "${PREFIX:?}" "${BINDIR:?}" "${PKCS11DIR:?}" "${MANDIR:?}" "${DOCDIR:?}" "${BASHCOMPDIR:?}"
: "${ZSHCOMPDIR:?}" "${FISHCOMPDIR:?}" "${UNITDIR:?}" "${SYSUSERSDIR:?}" "${SYSCONFDIR:?}"
DESTDIR=${DESTDIR:-}
INSTALL_CONFIG=${INSTALL_CONFIG:-yes}
cd "$(dirname "$0")/.."
manifest=$DESTDIR$DOCDIR/MANIFEST

# put MODE SRC DST: install one file and record it.
put() {
	install -D -m "$1" "$2" "$DESTDIR$3"
	echo "$3" >>"$manifest.new"
}

# gen MODE DST CMD...: install the output of a command.
gen() {
	mode=$1 dst=$2
	shift 2
	tmp=$(mktemp)
	"$@" >"$tmp"
	put "$mode" "$tmp" "$dst"
	rm -f "$tmp"
}

do_install() {
	for b in hactl haagent hsmserve libhapkcs11.so hapkcs11-helper; do
		[ -f "$BIN/$b" ] || { echo "install: $BIN/$b is missing: run make build first" >&2; exit 1; }
	done
	mkdir -p "$DESTDIR$DOCDIR"
	: >"$manifest.new"
	for b in hactl haagent hsmserve; do
		put 0755 "$BIN/$b" "$BINDIR/$b"
	done
	put 0644 "$BIN/libhapkcs11.so" "$PKCS11DIR/libhapkcs11.so"
	# Beside the module, where it looks for its helper (forked children).
	put 0755 "$BIN/hapkcs11-helper" "$PKCS11DIR/hapkcs11-helper"
	for page in man/*.[1358]; do
		sec=${page##*.}
		gen 0644 "$MANDIR/man$sec/$(basename "$page").gz" gzip -9nc "$page"
	done
	gen 0644 "$BASHCOMPDIR/hactl" "$BIN/hactl" completion bash
	gen 0644 "$ZSHCOMPDIR/_hactl" "$BIN/hactl" completion zsh
	gen 0644 "$FISHCOMPDIR/hactl.fish" "$BIN/hactl" completion fish
	gen 0644 "$UNITDIR/haagent.service" sed "s|^ExecStart=/usr/local/bin/haagent|ExecStart=$BINDIR/haagent|" configs/haagent.service
	put 0644 packaging/hagroup.sysusers "$SYSUSERSDIR/hagroup.conf"
	for f in configs/*; do
		[ -f "$f" ] && [ "$f" != configs/haagent.service ] || continue
		put 0644 "$f" "$DOCDIR/examples/$(basename "$f")"
	done
	put 0644 README.md "$DOCDIR/README.md"
	put 0644 LICENSE "$DOCDIR/copyright"
	echo "$DOCDIR/MANIFEST" >>"$manifest.new"
	mv "$manifest.new" "$manifest"

	conf=$DESTDIR$SYSCONFDIR/hagroup/hagroup.toml
	wrote=no
	if [ "$INSTALL_CONFIG" = yes ] && [ ! -e "$conf" ]; then
		install -D -m 0640 packaging/hagroup.toml "$conf"
		wrote=yes
		echo "install: wrote $conf (a valid start with no groups yet)"
	fi
	# A live install (no DESTDIR) also makes the agent's system user, as the
	# .deb does, and lets it read the configuration written just now.
	if [ -z "$DESTDIR" ] && command -v systemd-sysusers >/dev/null 2>&1; then
		systemd-sysusers "$SYSUSERSDIR/hagroup.conf"
		if [ "$wrote" = yes ]; then
			chgrp hagroup "$conf" "$(dirname "$conf")"
			chmod 0750 "$(dirname "$conf")"
		fi
	fi
	echo "install: $(wc -l <"$manifest") files under ${DESTDIR:-/}, listed in $DOCDIR/MANIFEST"
}

do_uninstall() {
	[ -f "$manifest" ] || { echo "uninstall: $manifest not found: nothing installed there" >&2; exit 1; }
	while read -r f; do
		rm -f "$DESTDIR$f"
		d=$(dirname "$DESTDIR$f")
		# Remove the directories we made, up to the first one still in use.
		while [ "$d" != "$DESTDIR$PREFIX" ] && [ "$d" != / ] && rmdir "$d" 2>/dev/null; do
			d=$(dirname "$d")
		done
	done <"$manifest"
	echo "uninstall: done; $SYSCONFDIR/hagroup and the hagroup user are left in place"
}

case "${1:-}" in
install) do_install ;;
uninstall) do_uninstall ;;
*) echo "usage: $0 install|uninstall" >&2; exit 2 ;;
esac
