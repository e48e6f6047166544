package agent

// ServerVersion returns the agent's build version from the last answer
// ("" before the first).
func (c *Client) ServerVersion() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.serverVersion
}
