package main

import (
	"slices"
	"testing"
)

func TestMakeDomainCheckTable(t *testing.T) {
	c := domainCheck{Group: "g", Members: []domainCheckLine{
		{Member: "a", Status: domainOK, Trusted: true, CheckValue: "0a0b0c"},
		{Member: "b", Status: domainWeak, CheckValue: "0a0b0c", Flaws: []string{"CKA_MODIFIABLE=true", "CKA_COPYABLE=true"}},
		{Member: "c", Status: domainMissing},
		{Member: "d", Status: domainError, Error: "member d: token not present"},
		{Member: "e", Status: domainUntrusted, CheckValue: "0a0b0c", Flaws: []string{"not CKA_TRUSTED"}},
		{Member: "f", Status: domainNone, Flaws: []string{"the token cannot keep a wrap-only key", "CKA_UNWRAP_TEMPLATE not tried"}},
	}}
	td := makeDomainCheckTable(c)
	if !slices.Equal(td.header, []string{"MEMBER", "DOMAIN KEY", "TRUSTED", "CHECK VALUE", "DETAIL"}) {
		t.Fatalf("header %q", td.header)
	}
	want := [][]string{
		{"a", "ok", "yes", "0a0b0c", "-"},
		{"b", "weak", "no", "0a0b0c", "CKA_MODIFIABLE=true, CKA_COPYABLE=true"},
		{"c", "missing", "-", "-", "-"},
		{"d", "error", "-", "-", "member d: token not present"},
		{"e", "untrusted", "no", "0a0b0c", "not CKA_TRUSTED"},
		{"f", "none", "-", "-", "the token cannot keep a wrap-only key, CKA_UNWRAP_TEMPLATE not tried"},
	}
	for i, row := range td.rows {
		if !slices.Equal(row, want[i]) {
			t.Errorf("row %d: %q, want %q", i, row, want[i])
		}
	}
	if n := c.problems(); n != 4 {
		t.Errorf("problems %d, want 4", n)
	}
}
