package feed

// ScanRegistry rescans the registry now instead of when due, so that a
// test sees a registration without waiting for RegistryEvery.
func (in *Ingester) ScanRegistry() {
	if !in.held {
		panic("BUG: feed: ScanRegistry without the ingester lock")
	}
	in.scanRegistry()
	in.publish()
}

// ReplayConfirmed reports whether no batch of the replay made at
// connection waits for a live batch to prove it the engine's.
func (s *ZMQSubscriber) ReplayConfirmed() bool { return !s.replayUnconfirmed.Load() }
