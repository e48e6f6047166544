package main

import (
	"slices"
	"testing"
)

func TestMakeObjectsTable(t *testing.T) {
	res := objectsResult{
		Members: []memberLook{{Name: "a", Read: true}, {Name: "b", Read: true}, {Name: "c", Error: "down"}},
		Objects: []objectCopies{
			{Identity: `private key EC id=01 label="k"`, Holders: []string{"a", "b"}, Lacking: []string{}, Differs: []string{"b"}},
			{Identity: `secret key AES id=02 label="s"`, Holders: []string{"a"}, Lacking: []string{"b"}, Differs: []string{}},
			{Identity: `data id=none label="d"`, Holders: []string{"a", "b"}, Lacking: []string{}, Differs: []string{}},
		},
	}
	header, rows := makeObjectsTable(res)
	if !slices.Equal(header, []string{"OBJECT", "HELD BY", "LACKED BY", "DIFFERS ON"}) {
		t.Fatalf("header %q", header)
	}
	want := [][]string{
		{`private key EC id=01 label="k"`, "a,b", "-", "b"},
		{`secret key AES id=02 label="s"`, "a", "b", "-"},
		{`data id=none label="d"`, "a,b", "-", "-"},
	}
	if !slices.EqualFunc(rows, want, slices.Equal[[]string]) {
		t.Fatalf("rows %q, want %q", rows, want)
	}
	// c not read, the key differing, the secret lacked: 3; the data object is fine.
	if n := objectsProblems(res); n != 3 {
		t.Fatalf("objectsProblems = %d, want 3", n)
	}
}
