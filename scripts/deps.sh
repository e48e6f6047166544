#!/usr/bin/env bash
# Installs what a fresh Debian 12 machine lacks to build, test and demo
# hagroup: SoftHSM, the PKCS#11 clients the tests drive, and Go modules.
# Idempotent and quiet when everything is already there.
set -euo pipefail

packages=(
	softhsm2                 # the member tokens of every test and of the demo
	opensc                   # pkcs11-tool
	p11-kit                  # `p11-kit server`: members that can really die
	p11-kit-modules          # p11-kit-client.so
	gnutls-bin               # p11tool
	libengine-pkcs11-openssl # OpenSSL's pkcs11 engine
	nginx                    # forking servers: nginx's workers sign through the module's helper
	apache2                  # and Apache httpd's prefork children
	python3-pykcs11          # a Python multiprocessing pool signing through the module
	openssl
	openssh-client           # ssh-keygen -D
	libnss3-tools            # certutil, modutil: the NSS client test, NSS member databases
	libnss3                  # libsoftokn3.so: NSS softokn, a second make of member token
	swtpm swtpm-tools        # a software TPM per test, for tpm2-pkcs11 tokens
	libtpm2-pkcs11-1         # libtpm2_pkcs11.so: a third make of token (sign-only)
	libtpm2-pkcs11-tools     # tpm2_ptool, to make its store
	libtss2-tcti-swtpm0      # the TSS's swtpm transport
	tpm2-tools               # tpm2_flushcontext
	opencryptoki             # pkcsslotd and its soft token (IBM SoftTok), a fourth make
	gcc libc6-dev            # cgo, and the C test harnesses
	openjdk-17-jdk-headless  # SunPKCS11 client test
	util-linux               # setpriv, for the permission tests
	prometheus               # promtool, to check configs/prometheus/hagroup-rules.yml
	bash-completion          # hactl's bash completion test
)

missing=()
for p in "${packages[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if ((${#missing[@]})); then
	sudo=""
	[[ $(id -u) -eq 0 ]] || sudo="sudo"
	echo "deps: installing ${missing[*]}"
	$sudo apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if ! command -v go >/dev/null; then
	if [[ -x /usr/local/go/bin/go ]]; then
		export PATH=$PATH:/usr/local/go/bin
	else
		echo "deps: Go 1.26 is required (https://go.dev/dl/)" >&2
		exit 1
	fi
fi
go mod download
