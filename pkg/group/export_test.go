package group

import "testing"

// Example names the last three pool tokens by label (tok-297 …).
func TestExampleTokensAreReserved(t *testing.T) {
	if poolSize-3 != 297 {
		t.Fatalf("Example uses tok-297…299 but the pool has %d tokens", poolSize)
	}
}
