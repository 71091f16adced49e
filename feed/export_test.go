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
