// Command rpcgen writes the C code of libhapkcs11.so that follows the list
// of PKCS#11 functions: forward.c (each C_ entry point: the in-process
// engine, or the helper over its socket) and rpc_gen.c (the C client's
// stub and the helper's dispatch of every function). The one description
// is the OASIS header pkcs11f.h, read as it is, and the argument kinds
// below, inferred from each argument's type and the argument after it; a
// function whose arguments match no kind stops the generator. It writes
// rpc_params.c too: the mechanism parameters that hold pointers, from
// pkcs11t.h's structures (params.go), and their Go twin for hsmserve,
// internal/mechparam/layouts_gen.go; and hsmserve's op numbers and the
// functions it serves, pkg/remote/ops_gen.go, and remote.Client's
// methods, pkg/remote/client_gen.go (remote.go).
//
// Run by `go generate ./cmd/hapkcs11` (-o DIR writes elsewhere: the test
// that the committed files are current).
package main

import (
	"bytes"
	"flag"
	"fmt"
	"go/format"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/hagroup/hagroup/pkg/group/opstate"
	"github.com/hagroup/hagroup/pkg/slot"
)

// arg is one parameter of a PKCS#11 function as pkcs11f.h declares it.
type arg struct{ typ, name string }

// fn is one PKCS#11 function.
type fn struct {
	name string // without the C_ prefix
	args []arg
}

// kind is how a group of consecutive arguments crosses the socket; width
// is how many arguments it takes.
type kind struct {
	name  string // the suffix of the hap_put_/hap_take_/hap_reply_/hap_get_ functions in rpc.c
	width int
	out   bool // the helper answers something for it
}

var (
	kUlong     = kind{"ulong", 1, false}    // a value: handle, slot, flags, type, count
	kIn        = kind{"in", 2, false}       // bytes in: pointer, length
	kOut       = kind{"out", 2, true}       // bytes out: pointer, pointer to length (the PKCS#11 length convention)
	kLabel     = kind{"label", 1, false}    // C_InitToken's 32 blank-padded bytes
	kList      = kind{"list", 2, true}      // CK_ULONGs out: pointer, pointer to count (same convention)
	kListMax   = kind{"listmax", 3, true}   // C_FindObjects: pointer, capacity, pointer to count
	kUlongOut  = kind{"ulongout", 1, true}  // one CK_ULONG out: a new handle, a size, a slot
	kStructOut = kind{"structout", 1, true} // a CK_*_INFO out: flat structures, copied as bytes
	kMech      = kind{"mech", 1, false}     // CK_MECHANISM in
	kTmpl      = kind{"tmpl", 2, false}     // attributes in: pointer, count
	kTmplOut   = kind{"tmplout", 2, true}   // C_GetAttributeValue's attributes: types and room in, lengths and values out
	kNone      = kind{"none", 1, false}     // application data, callbacks, reserved: never sent, NULL in the helper
)

// local are the functions entry.c writes by hand: they start and end the
// engine or the helper.
var local = map[string]bool{"Initialize": true, "Finalize": true, "GetFunctionList": true}

// folds pairs each Init that takes a mechanism with its single-part call
// (SignInit with Sign, ...), by name: an Init the helper answered CKR_OK
// rides with its call the next time (fold.c).
func folds(fns []fn) map[string]string {
	byName := map[string]bool{}
	for _, f := range fns {
		byName[f.name] = true
	}
	pairs := map[string]string{}
	for _, f := range fns {
		call, ok := strings.CutSuffix(f.name, "Init")
		if ok && byName[call] && len(f.args) > 1 && f.args[1].typ == "CK_MECHANISM_PTR" {
			pairs[f.name] = call
		}
	}
	return pairs
}

// leavesProofs reports whether a call leaves standing every kept Init's
// answer (fold.c): operations, reads and searches, and opening a session.
// Every other call may change objects, logins or sessions.
func leavesProofs(name string) bool {
	for _, suffix := range []string{"Init", "Update", "Final"} {
		if strings.HasSuffix(name, suffix) {
			return true
		}
	}
	switch name {
	case "Sign", "Verify", "Encrypt", "Decrypt", "Digest", "SignRecover", "VerifyRecover", "DigestKey",
		"FindObjects", "GenerateRandom", "SeedRandom", "OpenSession", "WaitForSlotEvent", "CancelFunction":
		return true
	}
	return strings.HasPrefix(name, "Get")
}

// kinds assigns a kind to each argument group of f.
func kinds(f fn) ([]kind, error) {
	var ks []kind
	a := f.args
	next := func(i int) string {
		if i+1 < len(a) {
			return a[i+1].typ
		}
		return ""
	}
	for i := 0; i < len(a); {
		t := a[i].typ
		var k kind
		switch {
		case t == "CK_NOTIFY" || t == "CK_VOID_PTR":
			k = kNone
		case t == "CK_SESSION_HANDLE" || t == "CK_SLOT_ID" || t == "CK_FLAGS" || t == "CK_OBJECT_HANDLE" ||
			t == "CK_USER_TYPE" || t == "CK_MECHANISM_TYPE" || t == "CK_BBOOL" || t == "CK_ULONG":
			k = kUlong
		case (t == "CK_BYTE_PTR" || t == "CK_UTF8CHAR_PTR") && next(i) == "CK_ULONG":
			k = kIn
		case t == "CK_BYTE_PTR" && next(i) == "CK_ULONG_PTR":
			k = kOut
		case t == "CK_UTF8CHAR_PTR" && a[i].name == "pLabel":
			k = kLabel
		case (t == "CK_SLOT_ID_PTR" || t == "CK_MECHANISM_TYPE_PTR") && next(i) == "CK_ULONG_PTR":
			k = kList
		case t == "CK_OBJECT_HANDLE_PTR" && next(i) == "CK_ULONG" && i+2 < len(a) && a[i+2].typ == "CK_ULONG_PTR":
			k = kListMax
		case t == "CK_OBJECT_HANDLE_PTR" || t == "CK_SESSION_HANDLE_PTR" || t == "CK_SLOT_ID_PTR" || t == "CK_ULONG_PTR":
			k = kUlongOut
		case t == "CK_INFO_PTR" || t == "CK_SLOT_INFO_PTR" || t == "CK_TOKEN_INFO_PTR" ||
			t == "CK_MECHANISM_INFO_PTR" || t == "CK_SESSION_INFO_PTR":
			k = kStructOut
		case t == "CK_MECHANISM_PTR":
			k = kMech
		case t == "CK_ATTRIBUTE_PTR" && next(i) == "CK_ULONG" && f.name == "GetAttributeValue":
			k = kTmplOut
		case t == "CK_ATTRIBUTE_PTR" && next(i) == "CK_ULONG":
			k = kTmpl
		default:
			return nil, fmt.Errorf("C_%s: no kind for argument %s %s", f.name, t, a[i].name)
		}
		ks = append(ks, k)
		i += k.width
	}
	return ks, nil
}

var (
	comment = regexp.MustCompile(`(?s)/\*.*?\*/`)
	decl    = regexp.MustCompile(`(?s)CK_PKCS11_FUNCTION_INFO\(C_(\w+)\)\s*#ifdef CK_NEED_ARG_LIST\s*\((.*?)\);`)
)

// parse reads the functions of pkcs11f.h in its order (the function
// list's order).
func parse(src []byte) ([]fn, error) {
	text := comment.ReplaceAll(src, nil)
	var fns []fn
	for _, m := range decl.FindAllSubmatch(text, -1) {
		f := fn{name: string(m[1])}
		for _, p := range strings.Split(string(m[2]), ",") {
			w := strings.Fields(p)
			if len(w) != 2 {
				return nil, fmt.Errorf("C_%s: cannot read argument %q", f.name, strings.TrimSpace(p))
			}
			f.args = append(f.args, arg{w[0], w[1]})
		}
		fns = append(fns, f)
	}
	if len(fns) != 68 {
		return nil, fmt.Errorf("pkcs11f.h: found %d functions, PKCS#11 v2.40 has 68", len(fns))
	}
	return fns, nil
}

func params(f fn) string {
	var s []string
	for _, a := range f.args {
		s = append(s, a.typ+" "+a.name)
	}
	return strings.Join(s, ", ")
}

func names(as []arg) string {
	var s []string
	for _, a := range as {
		s = append(s, a.name)
	}
	return strings.Join(s, ", ")
}

const header = "/* Code generated by rpcgen from pkcs11f.h; DO NOT EDIT. */\n\n"

// forward writes forward.c: every C_ entry point but entry.c's.
func forward(fns []fn) []byte {
	var b bytes.Buffer
	b.WriteString(header)
	b.WriteString(`/*
 * forward.c — one C entry point per PKCS#11 v2.40 function (except
 * C_Initialize, C_Finalize and C_GetFunctionList, in entry.c). Each runs
 * the entry guard (entry.h) and then calls the in-process engine (abi.go:
 * hapOpInit and hapStep for the operations, hapXxx for the rest) or, when
 * this process is served by a helper, the C client's stub (hap_rpc_Xxx in
 * rpc_gen.c).
 */
#include "hapkcs11.h"
#include "entry.h"
#include "rpc.h"
#include "_cgo_export.h"
`)
	for _, f := range fns {
		if local[f.name] {
			continue
		}
		fmt.Fprintf(&b, "\nCK_RV C_%s(%s)\n{\n\tHAP_ENTER();\n", f.name, params(f))
		fmt.Fprintf(&b, "\tCK_RV rv = hap_remote() ? hap_rpc_%s(%s) : %s;\n", f.name, names(f.args), engine(f))
		b.WriteString("\tHAP_LEAVE();\n\treturn rv;\n}\n")
	}
	return b.Bytes()
}

// refused are the functions of a session the engine answers with a
// refusal, after the usual session check, and the refusal: sign/verify
// with recovery and the dual-function updates, which neither SoftHSM nor
// the engine offers; a PIN's initialisation or change, an operator's job
// on each member; an operation's state, which lives on one member and
// would not restore on another; and the legacy parallel functions.
var refused = map[string]string{
	"SignRecoverInit": "CKR_FUNCTION_NOT_SUPPORTED", "SignRecover": "CKR_FUNCTION_NOT_SUPPORTED",
	"VerifyRecoverInit": "CKR_FUNCTION_NOT_SUPPORTED", "VerifyRecover": "CKR_FUNCTION_NOT_SUPPORTED",
	"DigestEncryptUpdate": "CKR_FUNCTION_NOT_SUPPORTED", "DecryptDigestUpdate": "CKR_FUNCTION_NOT_SUPPORTED",
	"SignEncryptUpdate": "CKR_FUNCTION_NOT_SUPPORTED", "DecryptVerifyUpdate": "CKR_FUNCTION_NOT_SUPPORTED",
	"InitPIN": "CKR_FUNCTION_NOT_SUPPORTED", "SetPIN": "CKR_FUNCTION_NOT_SUPPORTED",
	"GetOperationState": "CKR_FUNCTION_NOT_SUPPORTED", "SetOperationState": "CKR_FUNCTION_NOT_SUPPORTED",
	"GetFunctionStatus": "CKR_FUNCTION_NOT_PARALLEL", "CancelFunction": "CKR_FUNCTION_NOT_PARALLEL",
}

// engine is the in-process engine's call for f (abi.go): an operation
// family's Init or step goes to hapOpInit or hapStep with its kind and step
// by opstate's numbers, a refused function to hapRefuse, and
// every other function to its own hapXxx.
func engine(f fn) string {
	h := f.args[0].name
	if rv := refused[f.name]; rv != "" {
		return fmt.Sprintf("hapRefuse(%s, \"C_%s\", %s)", h, f.name, rv)
	}
	for k := range opstate.Kind(slot.NumKinds) {
		if f.name == k.InitName() {
			key := "0"
			if len(f.args) > 2 {
				key = f.args[2].name
			}
			return fmt.Sprintf("hapOpInit(%s, %d /* %s */, %s, %s)", h, k, k, f.args[1].name, key)
		}
		for _, st := range []opstate.Step{opstate.Single, opstate.Update, opstate.Final} {
			if f.name == st.Name(k) {
				return fmt.Sprintf("hapStep(%s, %d /* %s */, %d, %s)", h, k, k, st, stepArgs(f, k, st))
			}
		}
	}
	return fmt.Sprintf("hap%s(%s)", f.name, names(f.args))
}

// stepArgs are hapStep's arguments after the step for f: its input, the
// signature to verify, and its output with withOut.
func stepArgs(f fn, k opstate.Kind, st opstate.Step) string {
	var ins []string
	out := "NULL, NULL, 0"
	ks, _ := kinds(f) // (forward runs after rpc, which stops on an argument of no kind)
	i := 1
	for _, kd := range ks[1:] {
		switch kd {
		case kIn:
			ins = append(ins, names(f.args[i:i+2]))
		case kOut:
			out = names(f.args[i:i+2]) + ", 1"
		}
		i += kd.width
	}
	if k == opstate.Kind(slot.KindVerify) && st == opstate.Final {
		ins = append([]string{"NULL, 0"}, ins...) // C_VerifyFinal has only the signature
	}
	for len(ins) < 2 {
		ins = append(ins, "NULL, 0")
	}
	return strings.Join(ins, ", ") + ", " + out
}

// rpc writes rpc_gen.c: the op numbers, each function's client stub and
// the helper's dispatch.
func rpc(fns []fn) ([]byte, error) {
	var b bytes.Buffer
	b.WriteString(header)
	b.WriteString(`/*
 * rpc_gen.c — the C client's stub of every forwarded PKCS#11 function and
 * the helper's dispatch of each to the module's own entry point; the
 * marshalling of each argument kind is in rpc.c.
 */
#include "hapkcs11.h"
#include "rpc.h"
`)
	var served []fn
	for _, f := range fns {
		if !local[f.name] {
			served = append(served, f)
		}
	}
	// Client stubs.
	opOf := map[string]int{}
	for op, f := range served {
		opOf[f.name] = op + 1
	}
	pairs := folds(served)
	calls := map[string]string{}
	for init, call := range pairs {
		calls[call] = init
	}
	for op, f := range served {
		ks, err := kinds(f)
		if err != nil {
			return nil, err
		}
		session := f.args[0].typ == "CK_SESSION_HANDLE"
		fmt.Fprintf(&b, "\nCK_RV hap_rpc_%s(%s)\n{\n", f.name, params(f))
		if session && pairs[f.name] == "" && calls[f.name] == "" {
			fmt.Fprintf(&b, "\tCK_RV held = hap_fold_flush(%s);\n\tif (held != CKR_OK)\n\t\treturn held;\n", f.args[0].name)
		}
		fmt.Fprintf(&b, "\tstruct hap_msg m;\n\thap_msg_start(&m, %d);\n", op+1)
		if !leavesProofs(f.name) {
			b.WriteString("\tm.changes = 1;\n")
		}
		i := 0
		for _, k := range ks {
			as := f.args[i : i+k.width]
			i += k.width
			switch k {
			case kNone:
			case kStructOut:
				fmt.Fprintf(&b, "\thap_put_%s(&m, %s, sizeof *%[2]s);\n", k.name, as[0].name)
			default:
				fmt.Fprintf(&b, "\thap_put_%s(&m, %s);\n", k.name, names(as))
			}
		}
		switch {
		case pairs[f.name] != "":
			fmt.Fprintf(&b, "\tCK_RV rv = hap_fold_init(&m, %s, %d);\n", f.args[0].name, opOf[pairs[f.name]])
		case calls[f.name] != "":
			ends := "1"
			i = 0
			for _, k := range ks {
				if k == kOut {
					ends = f.args[i].name + " != NULL"
				}
				i += k.width
			}
			fmt.Fprintf(&b, "\tCK_RV rv = hap_fold_call(&m, %s, %d, %s);\n", f.args[0].name, op+1, ends)
		default:
			b.WriteString("\tCK_RV rv = hap_call(&m);\n")
		}
		outputs(&b, f, ks, "\thap_get_%s(&m, rv, %s")
		b.WriteString("\treturn hap_msg_end(&m, rv);\n}\n")
	}
	// Helper dispatch.
	b.WriteString("\nvoid hap_dispatch(struct hap_req *r)\n{\n\tswitch (r->op) {\n")
	for op, f := range served {
		ks, _ := kinds(f)
		fmt.Fprintf(&b, "\tcase %d: {\n", op+1)
		for _, a := range f.args {
			fmt.Fprintf(&b, "\t\t%s %s = 0;\n", a.typ, a.name)
		}
		i := 0
		for _, k := range ks {
			as := f.args[i : i+k.width]
			i += k.width
			var ptrs []string
			for _, a := range as {
				ptrs = append(ptrs, "&"+a.name)
			}
			switch k {
			case kNone:
			case kUlong:
				fmt.Fprintf(&b, "\t\t%s = (%s)hap_take_ulong(r);\n", as[0].name, as[0].typ)
			case kStructOut:
				fmt.Fprintf(&b, "\t\thap_take_%s(r, &%s, sizeof *%[2]s);\n", k.name, as[0].name)
			default:
				fmt.Fprintf(&b, "\t\thap_take_%s(r, %s);\n", k.name, strings.Join(ptrs, ", "))
			}
		}
		fmt.Fprintf(&b, "\t\tCK_RV rv = r->bad ? CKR_ARGUMENTS_BAD : r->preset != CKR_OK ? r->preset : C_%s(%s);\n\t\thap_reply_rv(r, rv);\n", f.name, names(f.args))
		outputs(&b, f, ks, "\t\thap_reply_%s(r, rv, %s")
		b.WriteString("\t\treturn;\n\t}\n")
	}
	b.WriteString("\tdefault:\n\t\thap_reply_rv(r, CKR_FUNCTION_NOT_SUPPORTED);\n\t}\n}\n")
	return b.Bytes(), nil
}

// outputs writes one call of call (a format taking the kind's name and the
// arguments) per argument group of f that the helper answers: the client
// reads them (hap_get_) as the helper wrote them (hap_reply_).
func outputs(b *bytes.Buffer, f fn, ks []kind, call string) {
	i := 0
	for _, k := range ks {
		switch {
		case k == kStructOut:
			fmt.Fprintf(b, call+", sizeof *%[2]s);\n", k.name, f.args[i].name)
		case k.out:
			fmt.Fprintf(b, call+");\n", k.name, names(f.args[i:i+k.width]))
		}
		i += k.width
	}
}

// declarations writes rpc_gen.h: the stubs' prototypes.
func declarations(fns []fn) []byte {
	var b bytes.Buffer
	b.WriteString(header)
	b.WriteString("#ifndef HAPKCS11_RPC_GEN_H\n#define HAPKCS11_RPC_GEN_H\n\n")
	n := 0
	for _, f := range fns {
		if !local[f.name] {
			fmt.Fprintf(&b, "CK_RV hap_rpc_%s(%s);\n", f.name, params(f))
			n++
		}
	}
	fmt.Fprintf(&b, "\n/* HAP_OPS is the number of forwarded functions; ops run from 1. */\n#define HAP_OPS %d\n\n#endif\n", n)
	return b.Bytes()
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "rpcgen:", err)
		os.Exit(1)
	}
}

func run() error {
	out := flag.String("o", ".", "the directory to write the generated C files in")
	goOut := flag.String("go", "../../internal/mechparam/layouts_gen.go", "the Go file of the parameter layouts")
	opsOut := flag.String("ops", "../../pkg/remote/ops_gen.go", "the Go file of hsmserve's op numbers and the functions it serves")
	clientOut := flag.String("client", "../../pkg/remote/client_gen.go", "the Go file of remote.Client's methods")
	flag.Parse()
	src, err := os.ReadFile("pkcs11f.h")
	if err != nil {
		return err
	}
	fns, err := parse(src)
	if err != nil {
		return err
	}
	code, err := rpc(fns)
	if err != nil {
		return err
	}
	tsrc, err := os.ReadFile("pkcs11t.h")
	if err != nil {
		return err
	}
	ts, err := parseTypes(tsrc)
	if err != nil {
		return err
	}
	pcode, gcode, err := paramCode(ts)
	if err != nil {
		return err
	}
	if gcode, err = format.Source(gcode); err != nil {
		return fmt.Errorf("layouts_gen.go: %w", err)
	}
	if err := os.WriteFile(*goOut, gcode, 0o644); err != nil {
		return err
	}
	ops, client, err := remoteCode(fns)
	if err != nil {
		return err
	}
	for name, body := range map[string][]byte{*opsOut: ops, *clientOut: client} {
		if body, err = format.Source(body); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		if err := os.WriteFile(name, body, 0o644); err != nil {
			return err
		}
	}
	for name, body := range map[string][]byte{"forward.c": forward(fns), "rpc_gen.c": code, "rpc_gen.h": declarations(fns), "rpc_params.c": pcode} {
		if err := os.WriteFile(filepath.Join(*out, name), body, 0o644); err != nil {
			return err
		}
	}
	return nil
}
