package mechparam

import (
	"bytes"
	"encoding/binary"
	"reflect"
	"testing"
	"unsafe"
)

// Globals: raw structures point at them, and a global does not move.
var (
	source = []byte("label")
	oaep   = make([]byte, 40)
)

func put(b []byte, at int, v uint64) { binary.NativeEndian.PutUint64(b[at:], v) }

// A structure read in the process of its pointers and rebuilt in C memory
// reads back the same, one level of structure down included, and each
// length field of the rebuilt one is the length of what it points at.
func TestReadAndRebuild(t *testing.T) {
	l := For(0x00001054) // CKM_RSA_AES_KEY_WRAP
	if l == nil || l.Name != "CK_RSA_AES_KEY_WRAP_PARAMS" || len(l.Ptrs) != 1 || l.Ptrs[0].To == nil {
		t.Fatalf("CKM_RSA_AES_KEY_WRAP's layout: %+v", l)
	}
	o := l.Ptrs[0].To
	put(oaep, o.Words["hashAlg"], 0x250)
	put(oaep, o.Words["source"], 1)
	put(oaep, o.Ptrs[0].At, uint64(uintptr(unsafe.Pointer(unsafe.SliceData(source)))))
	put(oaep, o.Ptrs[0].Len, uint64(len(source)))
	raw := make([]byte, l.Size)
	put(raw, l.Words["ulAESKeyBits"], 256)
	put(raw, l.Ptrs[0].At, uint64(uintptr(unsafe.Pointer(unsafe.SliceData(oaep)))))

	v, err := FromRaw(l, raw, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	sub := v.Targets[0].Sub
	if sub == nil || !bytes.Equal(sub.Targets[0].Bytes, source) {
		t.Fatalf("the OAEP parameters were not read: %+v", v)
	}
	built, free, err := Build(v)
	if err != nil {
		t.Fatal(err)
	}
	defer free()
	back, err := FromRaw(l, built, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(back, v) {
		t.Errorf("rebuilt and read again:\n got %+v\nwant %+v", back, v)
	}
	// What the bytes' length fields say is never what the rebuilt one
	// says: the length of what came.
	put(sub.Struct, o.Ptrs[0].Len, 1<<40)
	built2, free2, err := Build(v)
	if err != nil {
		t.Fatal(err)
	}
	defer free2()
	if again, err := FromRaw(l, built2, 1<<20); err != nil || !bytes.Equal(again.Targets[0].Sub.Targets[0].Bytes, source) {
		t.Errorf("a lying length field over %d bytes: %+v, %v", len(source), again, err)
	}
	if _, err := FromRaw(l, raw, 39); err == nil {
		t.Errorf("a parameter of 45 bytes read within a bound of 39")
	}
}
