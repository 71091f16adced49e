package mocker

// hostPool is the engine's CPU tier (Config.HostBlocks): a bounded set of
// engine hashes whose blocks were copied to host memory when the GPU
// evicted them, as vLLM's OffloadingConnector and SGLang's HiCache keep
// evicted blocks. It holds no data, only which blocks are there, least
// recently used first. A block loaded back to the GPU keeps its host copy,
// as the engines' do. It is owned by the kvCache and is not safe for
// concurrent use; every array is sized once, so that it allocates nothing
// in steady state.
type hostPool struct {
	byHash  map[uint64]int32
	entries []hostEntry
	free    []int32 // entries not in use
	head    int32   // least recently used, noBlock when empty
	tail    int32
}

type hostEntry struct {
	hash       uint64
	prev, next int32
}

func newHostPool(n int) *hostPool {
	p := &hostPool{
		byHash:  make(map[uint64]int32, n),
		entries: make([]hostEntry, n),
		free:    make([]int32, n),
		head:    noBlock,
		tail:    noBlock,
	}
	for i := range p.free {
		p.free[i] = int32(n - 1 - i)
	}
	return p
}

func (p *hostPool) len() int { return len(p.byHash) }

// prefix returns how many leading hashes the pool holds.
func (p *hostPool) prefix(hashes []uint64) int {
	for i, h := range hashes {
		if _, ok := p.byHash[h]; !ok {
			return i
		}
	}
	return len(hashes)
}

// touch makes the block with hash h, which the pool must hold, the most
// recently used.
func (p *hostPool) touch(h uint64) {
	id := p.byHash[h]
	p.unlink(id)
	p.pushTail(id)
}

// put copies the block with hash h into the pool, or refreshes the copy
// it holds. To make room it drops the least recently used block, whose
// hash it returns with dropped set. added reports a new copy.
func (p *hostPool) put(h uint64) (victim uint64, dropped, added bool) {
	if _, ok := p.byHash[h]; ok {
		p.touch(h)
		return 0, false, false
	}
	if len(p.free) == 0 {
		id := p.head
		victim, dropped = p.entries[id].hash, true
		p.unlink(id)
		delete(p.byHash, victim)
		p.free = append(p.free, id)
	}
	id := p.free[len(p.free)-1]
	p.free = p.free[:len(p.free)-1]
	p.entries[id].hash = h
	p.byHash[h] = id
	p.pushTail(id)
	return victim, dropped, true
}

// clear drops every copy.
func (p *hostPool) clear() {
	for p.head != noBlock {
		id := p.head
		p.unlink(id)
		p.free = append(p.free, id)
	}
	clear(p.byHash)
}

func (p *hostPool) pushTail(id int32) {
	e := &p.entries[id]
	e.prev, e.next = p.tail, noBlock
	if p.tail == noBlock {
		p.head = id
	} else {
		p.entries[p.tail].next = id
	}
	p.tail = id
}

func (p *hostPool) unlink(id int32) {
	e := &p.entries[id]
	if e.prev == noBlock {
		p.head = e.next
	} else {
		p.entries[e.prev].next = e.next
	}
	if e.next == noBlock {
		p.tail = e.prev
	} else {
		p.entries[e.next].prev = e.prev
	}
	e.prev, e.next = noBlock, noBlock
}
