package p11raw

/*
#cgo CFLAGS: -O2 -I${SRCDIR}/../handoff
#cgo LDFLAGS: -lpthread
#include "place.h" // first: cell.h asks for _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>

typedef unsigned long hg_ulong;

typedef struct {
	hg_ulong mechanism;
	void *pParameter;
	hg_ulong ulParameterLen;
} hg_mech;

// Function list positions (pkcs11f.h order: CK_VERSION, then one pointer
// per function).
enum {
	HG_FN_SIGN_INIT = 42,
	HG_FN_SIGN = 43,
	HG_FN_VERIFY_INIT = 48,
	HG_FN_VERIFY = 49,
	HG_FN_LANE_COUNT = 50
};

typedef hg_ulong (*hg_op_init)(hg_ulong, hg_mech *, hg_ulong);
typedef hg_ulong (*hg_sign_fn)(hg_ulong, unsigned char *, hg_ulong, unsigned char *, hg_ulong *);
typedef hg_ulong (*hg_verify_fn)(hg_ulong, unsigned char *, hg_ulong, unsigned char *, hg_ulong);

typedef struct {
	unsigned char major, minor;
	void *fn[HG_FN_LANE_COUNT];
} hg_lane_fl;

enum { HG_LANE_SIGN = 1, HG_LANE_VERIFY = 2 };
enum { HG_IDLE = 0, HG_BUSY = 1, HG_ABANDONED = 2 };
#define HG_CKR_HOST_MEMORY 0x02UL
#define HG_CKR_BUFFER_TOO_SMALL 0x150UL
// Room for any signature of a key up to 32768 bits: the worker never has
// to grow it in practice.
#define HG_LANE_OUT 4096

// A lane: one C worker thread and the call it is given. The buffers are C
// memory, so a call the caller abandons keeps its arguments valid for as
// long as the module holds them. Freed when both the Go side and the
// worker have let go (refs).
typedef struct {
	hg_cell cell;
	uint32_t state;
	uint32_t quit;
	int32_t refs;
	int64_t spin_ns;
	int64_t last_ns; // how long the last answered call took
	hg_lane_fl *fl;

	hg_place place; // where the worker runs, how the caller waits (place.h)
	int yielded; // the last call was waited for by yielding, pinned

	// The context watch (Lane.watch): calls made under generation
	// watch_gen are cancelled once watch_dead equals it.
	uint32_t watch_gen, watch_dead;

	int op;
	hg_ulong session, mech, key, rv;
	unsigned char *param, *in, *out;
	hg_ulong param_len, param_cap, in_len, in_cap, out_len, out_cap;
} hg_lane;

static void hg_lane_release(hg_lane *l) {
	if (__atomic_sub_fetch(&l->refs, 1, __ATOMIC_SEQ_CST) != 0)
		return;
	free(l->param);
	free(l->in);
	free(l->out);
	free(l);
}

static void hg_lane_exec(hg_lane *l) {
	hg_mech m = { l->mech, l->param_len ? l->param : NULL, l->param_len };
	hg_op_init init = (hg_op_init)l->fl->fn[l->op == HG_LANE_SIGN ? HG_FN_SIGN_INIT : HG_FN_VERIFY_INIT];
	hg_ulong rv = init(l->session, &m, l->key);
	if (rv != 0) {
		l->rv = rv;
		return;
	}
	if (l->op == HG_LANE_VERIFY) {
		l->rv = ((hg_verify_fn)l->fl->fn[HG_FN_VERIFY])(l->session, l->in, l->in_len, l->out, l->out_len);
		return;
	}
	hg_sign_fn sign = (hg_sign_fn)l->fl->fn[HG_FN_SIGN];
	hg_ulong n = l->out_cap;
	rv = sign(l->session, l->in, l->in_len, l->out, &n);
	if (rv == HG_CKR_BUFFER_TOO_SMALL && n > l->out_cap) {
		// The operation is still active: retry with the length asked for.
		unsigned char *out = malloc(n);
		if (out != NULL) {
			free(l->out);
			l->out = out;
			l->out_cap = n;
			rv = sign(l->session, l->in, l->in_len, l->out, &n);
		}
	}
	l->out_len = rv == 0 ? n : 0;
	l->rv = rv;
}

// hg_lane_quiet blocks the asynchronous signals in the calling thread. A
// lane thread is not a Go thread, so the Go runtime does not field its
// signals: a module writing to a dead peer's socket (p11-kit's client,
// when the server is killed) would get SIGPIPE and, unhandled, the
// process would die with it. Blocked, the write fails with EPIPE and the
// module reports the member's failure. The application's own handlers
// (SIGINT, SIGTERM…) then never run on a lane either.
static void hg_lane_quiet(void) {
	sigset_t set;
	sigfillset(&set);
	int sync[] = { SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGABRT, SIGSYS };
	for (unsigned i = 0; i < sizeof sync / sizeof sync[0]; i++)
		sigdelset(&set, sync[i]);
	pthread_sigmask(SIG_BLOCK, &set, NULL);
}

static void *hg_lane_main(void *arg) {
	hg_lane *l = arg;
	uint32_t seq = 0;
	hg_lane_quiet();
	hg_place_started(&l->place);
	for (;;) {
		seq = hg_next_as(&l->cell, seq, l->spin_ns, hg_worker_mode(&l->place));
		if (LD(&l->quit)) {
			hg_leave();
			break;
		}
		hg_lane_exec(l);
		uint32_t busy = HG_BUSY;
		int kept = __atomic_compare_exchange_n(&l->state, &busy, HG_IDLE, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
		hg_done(&l->cell, seq);
		if (!kept)
			break; // abandoned: the caller is gone, the cleanup waits on the answer
	}
	hg_lane_release(l);
	return NULL;
}

// hg_lane_new starts a lane's thread; NULL when it cannot.
static hg_lane *hg_lane_new(void *fl, int64_t spin_ns) {
	hg_lane *l = calloc(1, sizeof *l);
	if (l == NULL)
		return NULL;
	l->out = malloc(HG_LANE_OUT);
	if (l->out == NULL) {
		free(l);
		return NULL;
	}
	l->out_cap = HG_LANE_OUT;
	l->fl = fl;
	l->spin_ns = spin_ns;
	hg_place_init(&l->place);
	l->refs = 2;
	pthread_attr_t attr;
	pthread_t t;
	pthread_attr_init(&attr);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	int err = pthread_create(&t, &attr, hg_lane_main, l);
	pthread_attr_destroy(&attr);
	if (err != 0) {
		free(l->out);
		free(l);
		return NULL;
	}
	return l;
}

static int hg_put(unsigned char **buf, hg_ulong *cap, hg_ulong *len, const void *src, hg_ulong n) {
	if (n > *cap) {
		unsigned char *b = malloc(n);
		if (b == NULL)
			return 0;
		free(*buf);
		*buf = b;
		*cap = n;
	}
	if (n)
		memcpy(*buf, src, n);
	*len = n;
	return 1;
}

// Outcomes of hg_lane_call, as handoff's Wait plus one.
enum { HG_ANSWERED = 0, HG_TIMED_OUT = 1, HG_CANCELLED = 2, HG_NO_MEMORY = 3 };

// A caller that sleeps through a call pays a thread wake-up on top of it
// (~20-30 us on the development VM). Through calls of up to this long (an
// RSA-2048 signature on SoftHSM takes ~0.6 ms) it spins instead, while a
// CPU is free for it; a slower member (a network HSM) is slept through:
// there the wake-up is a few per cent, and spinning would keep a CPU busy
// per waiting thread.
#define HG_LANE_FIT_MAX 1000000LL

// hg_lane_call copies a call into the lane, hands it to the worker and
// waits, spinning (or yielding, as place.h decides) first for up to
// spin_ns or, when the lane's last call took longer and at most
// HG_LANE_FIT_MAX, for half as long again as that call. On a deadline or
// cancel (of watch generation gen, when not 0) the call is abandoned (the
// worker ends after it) unless the worker finished first, which then
// counts as answered.
static int hg_lane_call(hg_lane *l, int op, hg_ulong session, hg_ulong mech,
                        void *param, hg_ulong param_len, hg_ulong key,
                        void *in, hg_ulong in_len, void *sig, hg_ulong sig_len,
                        int64_t spin_ns, int64_t timeout_ns, uint32_t gen) {
	if (!hg_put(&l->param, &l->param_cap, &l->param_len, param, param_len) ||
	    !hg_put(&l->in, &l->in_cap, &l->in_len, in, in_len))
		return HG_NO_MEMORY;
	if (op == HG_LANE_VERIFY && !hg_put(&l->out, &l->out_cap, &l->out_len, sig, sig_len))
		return HG_NO_MEMORY;
	l->op = op;
	l->session = session;
	l->mech = mech;
	l->key = key;
	int64_t fit = l->last_ns + l->last_ns / 2;
	if (fit > spin_ns && fit <= HG_LANE_FIT_MAX)
		spin_ns = fit;
	int mode = hg_place_wait(&l->place, __atomic_add_fetch(&hg_waiting, 1, __ATOMIC_SEQ_CST));
	l->yielded = mode == HG_SPIN_YIELD;
	ST(&l->state, HG_BUSY);
	int64_t start = hg_now();
	uint32_t seq = hg_post(&l->cell);
	// A cancel that came before the post did not see seq (hg_lane_unwatch).
	if (gen != 0 && LD(&l->watch_dead) == gen)
		ST(&l->cell.cancel, seq);
	int outcome = hg_wait_as(&l->cell, seq, spin_ns, timeout_ns, mode);
	__atomic_sub_fetch(&hg_waiting, 1, __ATOMIC_SEQ_CST);
	if (outcome == HG_ANSWERED) {
		l->last_ns = hg_now() - start;
		return outcome;
	}
	uint32_t busy = HG_BUSY;
	if (__atomic_compare_exchange_n(&l->state, &busy, HG_ABANDONED, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST))
		return outcome;
	hg_wait(&l->cell, seq, 0, -1); // the worker finished just now
	return HG_ANSWERED;
}

// hg_lane_seq is the sequence number of the last call posted.
static uint32_t hg_lane_seq(hg_lane *l) { return LD(&l->cell.req); }

// hg_lane_watch starts watch generation gen.
static void hg_lane_watch(hg_lane *l, uint32_t gen) { ST(&l->watch_gen, gen); }

// hg_lane_unwatch cancels the calls of generation gen: the one in flight,
// if any, and, through watch_dead, one being posted now (hg_lane_call
// checks after its post; whichever of the two comes second sees the
// other).
static void hg_lane_unwatch(hg_lane *l, uint32_t gen) {
	if (LD(&l->watch_gen) != gen)
		return;
	ST(&l->watch_dead, gen);
	hg_cancel(&l->cell, LD(&l->cell.req));
}

// hg_lane_abandoned waits until the worker has returned from an abandoned
// call, however long that takes, and lets go of the lane.
static void hg_lane_abandoned(hg_lane *l, uint32_t seq) {
	hg_wait(&l->cell, seq, 0, -1);
	hg_lane_release(l);
}

// hg_lane_close ends an idle lane's thread and lets go of the lane.
static void hg_lane_close(hg_lane *l) {
	ST(&l->quit, 1);
	hg_post(&l->cell);
	hg_lane_release(l);
}
*/
import "C"

import (
	"context"
	"sync"
	"time"
	"unsafe"

	_ "github.com/hagroup/hagroup/internal/handoff" // cell.c: the shared spin accounting
	"github.com/miekg/pkcs11"
)

// A Lane makes single-part signature calls (C_SignInit + C_Sign,
// C_VerifyInit + C_Verify) on one session of an in-process module from a
// C thread of its own, without the Go runtime on the module's side of the
// hand-off. The caller still waits with a deadline, so a call the module
// never answers is abandoned like any other (pkg/slot's rule), but the
// call costs one hand-off between two threads that spin for each other
// (or, with the CPUs saturated, yield one CPU to each other: place.h):
// no goroutine is readied, no P changes hands and no cgo call is made on
// the worker's side. With the session pool's order and the module's
// runtime settings (cmd/hapkcs11's procs.go) it took libhapkcs11.so from
// 0.47 to 0.90 of SoftHSM's own ECDSA rate for one application thread on
// the 2-vCPU development VM (docs/BENCHMARKS.md).
//
// One call at a time; the caller serialises (a Lane belongs to one
// session). Its zero value is not usable: see NewLane.
type Lane struct {
	l *C.hg_lane

	// The watch: the cancellation of the context whose Done channel is
	// watched cancels the lane's calls. It stays in place from call to
	// call while their contexts share that channel (libhapkcs11.so's calls
	// all do): registering with the context on every call cost 1.6-2.0 µs
	// of CPU per ECDSA signature (docs/BENCHMARKS.md). mu keeps the
	// callback off a lane being re-watched or let go.
	mu        sync.Mutex
	gen       uint32 // the watch's generation, 0 before the first
	watched   <-chan struct{}
	stopWatch func() bool
	done      bool // closed or abandoned: the callback must not touch l
}

// LaneOp is the operation a Lane runs.
type LaneOp int

// The operations a Lane runs.
const (
	LaneSign   LaneOp = C.HG_LANE_SIGN
	LaneVerify LaneOp = C.HG_LANE_VERIFY
)

// LaneOutcome is how a Lane call ended.
type LaneOutcome int

// The outcomes of Lane.Call. TimedOut and Cancelled leave the call
// abandoned: call Abandoned (typically on a goroutine of its own) to wait
// for the module to return and release the lane; the Lane is not usable
// any more.
const (
	LaneAnswered  LaneOutcome = C.HG_ANSWERED
	LaneTimedOut  LaneOutcome = C.HG_TIMED_OUT
	LaneCancelled LaneOutcome = C.HG_CANCELLED
	LaneNoMemory  LaneOutcome = C.HG_NO_MEMORY
)

// NewLane starts a lane on the module whose function list is fl (see
// FunctionList). workerSpin is how long its thread spins for the next call
// before it sleeps. It returns nil when no thread could be started.
func NewLane(fl unsafe.Pointer, workerSpin time.Duration) *Lane {
	l := C.hg_lane_new(fl, C.int64_t(workerSpin))
	if l == nil {
		return nil
	}
	return &Lane{l: l}
}

// LaneCall is one call: Data is signed (LaneSign) or Sig checked against it
// (LaneVerify) with Key under Mechanism.
type LaneCall struct {
	Op        LaneOp
	Session   pkcs11.SessionHandle
	Mechanism uint
	Parameter []byte // flat: a parameter holding pointers cannot go through a lane
	Key       pkcs11.ObjectHandle
	Data      []byte
	Sig       []byte

	// Yielded is set by Call when the CPUs were saturated with callers, so
	// that the lane's thread was pinned to the caller's CPU and the two
	// yielded it to each other (see internal/handoff/place.h).
	Yielded bool
}

// Call runs c on the lane's thread and waits for it at most timeout,
// spinning for up to spin first; ctx's cancellation ends the wait too.
// With LaneAnswered, err is the module's answer (a pkcs11.Error, as
// miekg/pkcs11 returns them) and sig the signature of a LaneSign.
func (l *Lane) Call(ctx context.Context, c *LaneCall, spin, timeout time.Duration) (sig []byte, outcome LaneOutcome, err error) {
	var gen uint32 // 0: a context that is never cancelled
	if done := ctx.Done(); done != nil {
		if done != l.watched {
			l.watch(ctx, done)
		}
		gen = l.gen
	}
	outcome = LaneOutcome(C.hg_lane_call(l.l, C.int(c.Op), C.hg_ulong(c.Session), C.hg_ulong(c.Mechanism),
		bytesPtr(c.Parameter), C.hg_ulong(len(c.Parameter)), C.hg_ulong(c.Key),
		bytesPtr(c.Data), C.hg_ulong(len(c.Data)), bytesPtr(c.Sig), C.hg_ulong(len(c.Sig)),
		C.int64_t(spin), C.int64_t(max(timeout, 0)), C.uint32_t(gen)))
	c.Yielded = l.l.yielded != 0
	if outcome != LaneAnswered {
		return nil, outcome, nil
	}
	if rv := l.l.rv; rv != 0 {
		return nil, outcome, pkcs11.Error(rv)
	}
	if c.Op == LaneSign {
		sig = C.GoBytes(unsafe.Pointer(l.l.out), C.int(l.l.out_len))
	}
	return sig, outcome, nil
}

// watch makes the cancellation of ctx, whose Done channel is done, cancel
// the lane's calls from now on, in place of the last context watched.
func (l *Lane) watch(ctx context.Context, done <-chan struct{}) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.stopWatch != nil {
		l.stopWatch()
	}
	l.gen++
	if l.gen == 0 { // 0 stands for no watch
		l.gen = 1
	}
	gen := l.gen
	C.hg_lane_watch(l.l, C.uint32_t(gen))
	l.watched = done
	l.stopWatch = context.AfterFunc(ctx, func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		if !l.done && l.gen == gen {
			C.hg_lane_unwatch(l.l, C.uint32_t(gen))
		}
	})
}

// unwatch ends the watch before the lane is let go.
func (l *Lane) unwatch() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.done = true
	if l.stopWatch != nil {
		l.stopWatch()
	}
}

// Abandoned waits, however long it takes, for the module to return from
// the call that Call gave up on, and releases the lane.
func (l *Lane) Abandoned() {
	l.unwatch()
	C.hg_lane_abandoned(l.l, C.hg_lane_seq(l.l))
}

// Close ends an idle lane's thread and releases the lane.
func (l *Lane) Close() {
	l.unwatch()
	C.hg_lane_close(l.l)
}

// bytesPtr is b's first byte for C, nil for an empty b.
func bytesPtr(b []byte) unsafe.Pointer {
	if len(b) == 0 {
		return nil
	}
	return unsafe.Pointer(&b[0])
}
