package group

import "testing"

// Example names the last three pool tokens by label (tok-257 …).
func TestExampleTokensAreReserved(t *testing.T) {
	if poolSize-3 != 257 {
		t.Fatalf("Example uses tok-257…259 but the pool has %d tokens", poolSize)
	}
}
