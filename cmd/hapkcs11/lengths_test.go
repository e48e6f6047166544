package main

import (
	"context"
	"testing"

	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/miekg/pkcs11"
)

// readCounter is a session that answers GetAttributes (a label that
// changes with every read) and counts the reads.
type readCounter struct {
	session
	reads int
}

func (r *readCounter) Check() error { return nil }

func (r *readCounter) GetAttributes(ctx context.Context, h uint, types []uint) ([]slot.Attribute, error) {
	r.reads++
	out := make([]slot.Attribute, len(types))
	for i, t := range types {
		out[i] = slot.Attribute{Type: t, Value: []byte{byte(r.reads)}, Status: pkcs11.CKR_OK}
	}
	return out, nil
}

// A C_GetAttributeValue for values that follows one for lengths on the
// same session, object and attributes is answered with what the length
// query read (one member call for the pair, with values that agree with
// the lengths); any other call in between, another object or other
// attributes read again.
func TestValueQueryAfterLengthQuery(t *testing.T) {
	be := &readCounter{}
	l := &library{ctx: context.Background(), sessions: map[uint]*appSession{1: {handle: 1, be: be}}}
	read := func(obj uint, lengths bool, types ...uint) []slot.Attribute {
		t.Helper()
		var got []slot.Attribute
		if err := l.withSession(1, func(s *appSession) (err error) {
			got, err = l.getAttributes(s, obj, types, lengths)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		return got
	}
	type step struct {
		obj     uint // 0: a call on the session that reads nothing (C_SetAttributeValue, C_SignInit, …)
		lengths bool
		attr    uint
	}
	cases := []struct {
		name  string
		steps []step
		reads int  // member reads in all
		agree bool // the last step answers what the first read
	}{
		{"length then value", []step{{7, true, pkcs11.CKA_LABEL}, {7, false, pkcs11.CKA_LABEL}}, 1, true},
		{"value then value", []step{{7, false, pkcs11.CKA_LABEL}, {7, false, pkcs11.CKA_LABEL}}, 2, false},
		{"a read between", []step{{7, true, pkcs11.CKA_LABEL}, {9, false, pkcs11.CKA_LABEL}, {7, false, pkcs11.CKA_LABEL}}, 3, false},
		{"another call between", []step{{7, true, pkcs11.CKA_LABEL}, {}, {7, false, pkcs11.CKA_LABEL}}, 2, false},
		{"another object", []step{{7, true, pkcs11.CKA_LABEL}, {9, false, pkcs11.CKA_LABEL}}, 2, false},
		{"other attributes", []step{{7, true, pkcs11.CKA_LABEL}, {7, false, pkcs11.CKA_ID}}, 2, false},
		{"once only", []step{{7, true, pkcs11.CKA_LABEL}, {7, false, pkcs11.CKA_LABEL}, {7, false, pkcs11.CKA_LABEL}}, 2, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			be.reads = 0
			var first, last []slot.Attribute
			for i, st := range c.steps {
				if st.obj == 0 {
					if err := l.withSession(1, func(*appSession) error { return nil }); err != nil {
						t.Fatal(err)
					}
					continue
				}
				last = read(st.obj, st.lengths, st.attr)
				if i == 0 {
					first = last
				}
			}
			if be.reads != c.reads {
				t.Errorf("%d member reads, want %d", be.reads, c.reads)
			}
			if agree := string(last[0].Value) == string(first[0].Value); agree != c.agree {
				t.Errorf("the last read answered %v, the first %v: want them equal %v", last[0].Value, first[0].Value, c.agree)
			}
		})
	}
}
