package recover

import "github.com/hagroup/hagroup/pkg/group"

var _ Engine = (*group.Group)(nil)
