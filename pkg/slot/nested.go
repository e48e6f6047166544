package slot

import (
	"errors"
	"fmt"
	"slices"

	"github.com/miekg/pkcs11"
)

// The PKCS#11 calls miekg/pkcs11 cannot express (attribute arrays such as
// CKA_UNWRAP_TEMPLATE) are made by internal/p11raw for in-process modules
// and carried as they are by pkg/remote for served ones.

// nestedTypes are the attribute types whose value is an attribute array.
var nestedTypes = []uint{pkcs11.CKA_WRAP_TEMPLATE, pkcs11.CKA_UNWRAP_TEMPLATE, pkcs11.CKA_DERIVE_TEMPLATE}

// checkNested validates a nested-template request.
func checkNested(tmpl []*pkcs11.Attribute, nested map[uint][]*pkcs11.Attribute) error {
	for t := range nested {
		if !slices.Contains(nestedTypes, t) {
			return fmt.Errorf("attribute 0x%X does not hold an attribute array", t)
		}
	}
	for _, at := range tmpl {
		if at == nil {
			return errors.New("nil attribute in template")
		}
		if _, dup := nested[at.Type]; dup {
			return fmt.Errorf("attribute 0x%X given both plain and nested", at.Type)
		}
	}
	return nil
}
