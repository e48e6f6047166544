package daemon

// MetricsAddr returns the address the metrics endpoint listens on ("" when
// off or not yet listening).
func (d *Daemon) MetricsAddr() string {
	d.mu.RLock()
	defer d.mu.RUnlock()
	return d.metricsAddr
}
