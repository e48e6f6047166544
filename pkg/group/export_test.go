package group

import "testing"

// Example names the last three pool tokens by label (tok-287 …).
func TestExampleTokensAreReserved(t *testing.T) {
	if poolSize-3 != 287 {
		t.Fatalf("Example uses tok-287…289 but the pool has %d tokens", poolSize)
	}
}
