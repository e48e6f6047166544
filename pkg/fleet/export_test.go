package fleet

// Delivered returns how many reports the agent has accepted.
func (r *Reporter) Delivered() uint64 {
	if r == nil {
		return 0
	}
	return r.delivered.Load()
}
