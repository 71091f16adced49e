package node

// Settled is closed once the node's start-up has settled (see
// awaitSettled): from then on /ready reports on the workers' health.
func (n *Node) Settled() <-chan struct{} { return n.settled }
