package opstate

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/miekg/pkcs11"
)

// One test of one token, for -count=3.
func TestMain(m *testing.M) { os.Exit(testhsm.Main(m, 4)) }

// On a token session the machine answers as PKCS#11 says: one operation
// of a kind at a time, a length query and a short buffer keep the output
// and the operation, the delivery ends it, and an Update pins it so that
// a single-part call then fails and ends it. The codes are the ones the
// module returns (slot.CodeOf, as pkg/group's CodeOf reads them).
func TestDirectOnAToken(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sl := testhsm.Take(t, 1)[0].Open(t)
	ss, err := sl.OpenSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	d := NewDirect(ctx, ss)
	defer d.Close()
	value := bytes.Repeat([]byte{0x42}, 32)
	key, err := ss.CreateObject(ctx, []*pkcs11.Attribute{
		pkcs11.NewAttribute(pkcs11.CKA_CLASS, pkcs11.CKO_SECRET_KEY), pkcs11.NewAttribute(pkcs11.CKA_KEY_TYPE, pkcs11.CKK_GENERIC_SECRET),
		pkcs11.NewAttribute(pkcs11.CKA_TOKEN, false), pkcs11.NewAttribute(pkcs11.CKA_SIGN, true), pkcs11.NewAttribute(pkcs11.CKA_VALUE, value),
	})
	if err != nil {
		t.Fatal(err)
	}
	mac := hmac.New(sha256.New, value)
	mac.Write([]byte("data"))
	want := mac.Sum(nil)
	mech := pkcs11.NewMechanism(pkcs11.CKM_SHA256_HMAC, nil)

	if err := d.Init(ctx, Sign, mech, key); err != nil {
		t.Fatal(err)
	}
	if err := d.Init(ctx, Sign, mech, key); !errors.Is(err, ErrActive) || slot.CodeOf(err) != pkcs11.CKR_OPERATION_ACTIVE {
		t.Fatalf("a second SignInit: %v, want CKR_OPERATION_ACTIVE", err)
	}
	if out, err := d.Do(ctx, Sign, Single, []byte("data"), nil, Query); err != nil || len(out) != len(want) {
		t.Fatalf("length query: %d bytes, %v; want %d, nil", len(out), err, len(want))
	}
	if _, err := d.Do(ctx, Sign, Single, []byte("data"), nil, 31); !errors.Is(err, ErrBufferTooSmall) || slot.CodeOf(err) != pkcs11.CKR_BUFFER_TOO_SMALL {
		t.Fatalf("a 31-byte buffer: %v, want CKR_BUFFER_TOO_SMALL", err)
	}
	if out, err := d.Do(ctx, Sign, Single, []byte("data"), nil, Any); err != nil || !bytes.Equal(out, want) {
		t.Fatalf("delivery: %x, %v; want the HMAC %x", out, err, want)
	}
	if _, err := d.Do(ctx, Sign, Single, []byte("data"), nil, Any); !errors.Is(err, ErrNotInitialized) || slot.CodeOf(err) != pkcs11.CKR_OPERATION_NOT_INITIALIZED {
		t.Fatalf("Sign after the delivery: %v, want CKR_OPERATION_NOT_INITIALIZED", err)
	}

	if err := d.Init(ctx, Sign, mech, key); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Do(ctx, Sign, Update, []byte("da"), nil, Any); err != nil {
		t.Fatal(err)
	}
	// The token answers (SoftHSM: CKR_OPERATION_NOT_INITIALIZED), not a
	// rule of the table's, and the operation is over.
	if _, err := d.Do(ctx, Sign, Single, []byte("data"), nil, Any); slot.CodeOf(err) != pkcs11.CKR_OPERATION_NOT_INITIALIZED {
		t.Fatalf("C_Sign after an Update: %v, want the token's CKR_OPERATION_NOT_INITIALIZED", err)
	}
	if err := d.Cancel(Sign); !errors.Is(err, ErrNotInitialized) {
		t.Fatalf("the failed C_Sign did not end the operation: Cancel says %v", err)
	}
	// The token's operation was abandoned too: a new one starts there.
	if err := d.Init(ctx, Sign, mech, key); err != nil {
		t.Fatalf("SignInit after the abandoned operation: %v", err)
	}
	if err := d.Cancel(Sign); err != nil {
		t.Fatal(err)
	}
}
