package group

import "testing"

// Example names the last three pool tokens by label (tok-147 …).
func TestExampleTokensAreReserved(t *testing.T) {
	if poolSize-3 != 147 {
		t.Fatalf("Example uses tok-147…149 but the pool has %d tokens", poolSize)
	}
}
