#!/usr/bin/env bash
# Sign throughput through libhapkcs11.so (a group of one SoftHSM member)
# against straight libsofthsm2.so on the same token, ECDSA P-256 and
# RSA-2048, 1 and 2 threads; the cost of loading the module and
# C_Initialize; the resident memory it adds.
#
# The ratios come from one process that loads both modules and signs
# through them in alternating slices (test/module/c/interleave.c: ROUNDS
# rounds of four SLICE_MS slices, ABBA, each slice's first fifth not
# counted), so that a virtual machine's drifting speed falls on both
# alike: the median of the rounds' ratios, with their quartiles. Separate runs of each module in a process of its
# own, alternating (RUNS of them, SECONDS_PER seconds per figure), give
# the load time, the memory and each module's rate on its own, with the
# median of the runs' own ratios beside them. Every throughput figure has
# the CPU per signature beside it (getrusage: the whole process, the
# module's worker threads included), and every figure is given for each
# dispatch of the member (handoff, inline; see hagroup.toml(5)). The
# load average before and after is printed with the figures: the ratios
# are fair on a busy machine, the absolute numbers are not.
#
#   test/module/bench.sh            (make bench runs it)
#   ROUNDS=60 RUNS=5 SECONDS_PER=3 test/module/bench.sh
#   AB_LIB=other.so AB_REPS=3 ROUNDS=12 test/module/bench.sh
#   DISPATCHES=inline AB_LIB=other.so test/module/bench.sh   (one dispatch)
#
# With AB_LIB, an A/B of two builds: the interleaved figures of LIB (a)
# and AB_LIB (b) in turn, AB_REPS times each, and no separate runs.
# With AA=1, each repetition first runs the harness A/A, the same module
# on both sides (aa-softhsm2: libsofthsm2.so against itself; aa-handoff,
# aa-inline: libhapkcs11.so against itself), whose ratios should be 1.
#
# Why the interleaved ratios are the ones to believe (docs/BENCHMARKS.md,
# "Third round"): A/A runs give CPU ratios of 0.94-1.06 (ECDSA) on both sides, so a
# slice's side and order cost nothing; giving libhapkcs11.so a SoftHSM of
# its own (a copy of libsofthsm2.so, so no session table, mutex or
# C_Initialize shared with the base module) moves its CPU ratio by less
# than the rounds' quartiles; the Go runtime's own threads take under 1 %
# of the samples, so what they do during the bare slices is noise. The
# separate runs' ratios are the noisier: one module's CPU per signature
# varies by up to a quarter from one process to the next.
set -euo pipefail
cd "$(dirname "$0")/../.."
export PATH=$PATH:/usr/local/go/bin

RUNS=${RUNS:-3}
SECONDS_PER=${SECONDS_PER:-2}
ROUNDS=${ROUNDS:-40}
SLICE_MS=${SLICE_MS:-100}
SOFTHSM=/usr/lib/softhsm/libsofthsm2.so
LIB=${LIB:-bin/libhapkcs11.so}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

if [[ ! -f $LIB ]]; then
	mkdir -p "$(dirname "$LIB")"
	go build -trimpath -buildmode=c-shared -ldflags='-s -w' -o "$LIB" ./cmd/hapkcs11
	rm -f "${LIB%.so}.h"
fi
LIB=$(realpath "$LIB")
gcc -O2 -Wall -I cmd/hapkcs11 -o "$work/bench" test/module/c/bench.c -ldl -lpthread
gcc -O2 -Wall -I cmd/hapkcs11 -o "$work/interleave" test/module/c/interleave.c -ldl -lpthread

# One throwaway token holding the two keys. The PIN never appears on a
# command line: pkcs11-tool reads it from the environment, bench from a file.
mkdir "$work/tokens"
printf 'directories.tokendir = %s\nobjectstore.backend = file\nlog.level = ERROR\n' "$work/tokens" >"$work/softhsm2.conf"
export SOFTHSM2_CONF=$work/softhsm2.conf
BENCH_PIN=$(od -An -N8 -tx1 /dev/urandom | tr -d ' \n')
export BENCH_PIN
printf '%s\n' "$BENCH_PIN" >"$work/pin"
chmod 600 "$work/pin"
# A fresh token directory: SoftHSM's free slot is slot 0.
pkcs11-tool --module "$SOFTHSM" --slot 0 --init-token --init-pin --login --login-type so --label bench \
	--so-pin env:BENCH_PIN --new-pin env:BENCH_PIN >/dev/null
for k in "EC:prime256v1 ec 01" "rsa:2048 rsa 02"; do
	set -- $k
	pkcs11-tool --module "$SOFTHSM" --token-label bench --login --pin env:BENCH_PIN \
		--keypairgen --key-type "$1" --label "$2" --id "$3" >/dev/null
done
slot=$(pkcs11-tool --module "$SOFTHSM" -L | awk '/^Slot .*\(0x/ {id=$3} /token label *: bench$/ {gsub(/[():]/, "", id); print id; exit}')

for d in handoff inline; do
	cat >"$work/hagroup-$d.toml" <<EOF
[agent]
state_dir = "$work/state-$d"

[[group]]
label = "bench"
serial = "1000001"

  [[group.member]]
  name = "softhsm"
  module = "$SOFTHSM"
  token_label = "bench"
  dispatch = "$d"
EOF
done

echo "load before: $(uptime)"
echo "bench: SoftHSM slot $slot vs virtual slot 0xf4241; interleaved: $ROUNDS rounds of 4 x ${SLICE_MS} ms per figure" >&2
libs=("$LIB")
[[ -n ${AB_LIB:-} ]] && libs+=("$(realpath "$AB_LIB")") && RUNS=0
# interleave TAG DISPATCH BASE BASE_SLOT MODULE SLOT: one interleaved run.
interleave() {
	HAGROUP_CONF=$work/hagroup-$2.toml "$work/interleave" "$3" "$4" "$5" "$6" "$work/pin" ec rsa "$SLICE_MS" "$ROUNDS" |
		sed "s|^|$1 |" >>"$work/interleaved"
}
for ((r = 0; r < ${AB_REPS:-1}; r++)); do
	if [[ -n ${AA:-} ]]; then
		interleave aa-softhsm2 inline "$SOFTHSM" "$slot" "$SOFTHSM" "$slot"
		for d in handoff inline; do
			interleave "aa-$d" "$d" "$LIB" 0xf4241 "$LIB" 0xf4241
		done
	fi
	for d in ${DISPATCHES:-handoff inline}; do
		for i in "${!libs[@]}"; do
			tag=$d
			((${#libs[@]} > 1)) && tag=$d/$(((i)) && echo b || echo a)
			interleave "$tag" "$d" "$SOFTHSM" "$slot" "${libs[i]}" 0xf4241
		done
	done
done
((RUNS)) && echo "bench: separate processes: $RUNS runs of ${SECONDS_PER}s per figure" >&2
# Which module runs first alternates from run to run, so that neither
# always follows the other.
for ((i = 0; i < RUNS; i++)); do
	order="softhsm2 handoff inline"
	((i % 2)) && order="inline handoff softhsm2"
	for m in $order; do
		case $m in
		softhsm2) "$work/bench" "$SOFTHSM" "$slot" "$work/pin" ec rsa "$SECONDS_PER" ;;
		*) HAGROUP_CONF=$work/hagroup-$m.toml "$work/bench" "$LIB" 0xf4241 "$work/pin" ec rsa "$SECONDS_PER" ;;
		esac | sed "s/^/$m /" >>"$work/results"
	done
done
echo "load after:  $(uptime)"

echo
echo "In one process, alternating slices (interleave.c): median of $ROUNDS rounds' ratios, quartiles;"
echo "CPU per signature of the whole process (getrusage), libhapkcs11.so over libsofthsm2.so"
awk '{
	delete v
	for (i = 3; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
	if (NR == 1) printf "%-8s %-26s %11s %11s %6s %-9s  %9s %9s %6s %s\n", "dispatch", "figure", "softhsm2/s", "hapkcs11/s", "ratio", "q1-q3", "us cpu sh", "us cpu ha", "cpu x", "q1-q3"
	printf "%-8s %-26s %11.1f %11.1f %6.2f %.2f-%.2f  %9.1f %9.1f %6.2f %.2f-%.2f\n", $1, $3 " " v["threads"] " thread sign", v["base_per_s"], v["module_per_s"], v["ratio"], v["q1"], v["q3"], v["base_cpu_us"], v["module_cpu_us"], v["cpu_ratio"], v["cpu_q1"], v["cpu_q3"]
}' "$work/interleaved"
((RUNS)) || exit 0
echo
echo "Each module in a process of its own: medians of $RUNS runs, and of the runs' own ratios"
awk '
function median(key,   n, i, j, t, a) {
	n = split(vals[key], a, " ")
	for (i = 2; i <= n; i++) for (j = i; j > 1 && a[j-1] + 0 > a[j] + 0; j--) { t = a[j]; a[j] = a[j-1]; a[j-1] = t }
	return n % 2 ? a[(n+1)/2] : (a[n/2] + a[n/2+1]) / 2
}
function add(mod, key, val,   n) {
	if (!(key in seen)) { seen[key] = 1; order[++nk] = key }
	vals[mod SUBSEP key] = vals[mod SUBSEP key] " " val
	n = ++count[mod SUBSEP key]
	run[mod SUBSEP key SUBSEP n] = val
}
{
	mod = $1
	if ($2 == "sign") {
		split($4, th, "="); split($5, v, "="); split($6, c, "=")
		add(mod, $3 " " th[2] " thread sign/s", v[2])
		add(mod, $3 " " th[2] " thread us CPU/sign", c[2])
	}
	else if ($2 == "load_init_us") add(mod, "load + C_Initialize (ms)", $3 / 1000)
	else if ($2 == "rss_added_kb") add(mod, "RSS added by load + init (MiB)", $3 / 1024)
	else if ($2 == "rss_after_kb") add(mod, "RSS added after the run (MiB)", $3 / 1024)
}
END {
	for (m = 1; m <= 2; m++) {
		mod = m == 1 ? "handoff" : "inline"
		printf "%s%-34s %12s %12s %8s  %s\n", m == 1 ? "" : "\n", "median, dispatch " mod, "libsofthsm2", "libhapkcs11", "ratio", "range of run ratios"
		row(mod)
	}
}
function row(mod,   i, k, a, b, lo, hi, r, d, q) {
	for (i = 1; i <= nk; i++) {
		k = order[i]
		if (!((mod SUBSEP k) in count)) continue
		a = median("softhsm2" SUBSEP k); b = median(mod SUBSEP k)
		delete vals["ratio" SUBSEP k]
		lo = hi = ""
		for (r = 1; r <= count[mod SUBSEP k]; r++) {
			d = run["softhsm2" SUBSEP k SUBSEP r]
			if (d <= 0) continue
			q = run[mod SUBSEP k SUBSEP r] / d
			vals["ratio" SUBSEP k] = vals["ratio" SUBSEP k] " " q
			if (lo == "" || q < lo) lo = q
			if (hi == "" || q > hi) hi = q
		}
		printf "%-34s %12.1f %12.1f %8.2f  %.2f-%.2f\n", k, a, b, median("ratio" SUBSEP k), lo, hi
	}
}' "$work/results"
