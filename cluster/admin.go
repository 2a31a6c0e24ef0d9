package cluster

// startHTTP serves the admin API and /metrics on addr (issue 9 fills this in).
func (n *Node) startHTTP(addr string) error { return nil }

// stopHTTP stops the admin server, if any.
func (n *Node) stopHTTP() {}
