package group

import "testing"

// Example names the last three pool tokens by label (tok-167 …).
func TestExampleTokensAreReserved(t *testing.T) {
	if poolSize-3 != 167 {
		t.Fatalf("Example uses tok-167…169 but the pool has %d tokens", poolSize)
	}
}
