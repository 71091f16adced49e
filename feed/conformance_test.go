package feed

import (
	"encoding/binary"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/kvfast/kvfast/radix"
	"github.com/kvfast/kvfast/workers"
)

// TestZMQConformance runs the wire conformance specs in
// testdata/conformance: every shape vLLM and SGLang have shipped, each
// case with the engine source (file and commit) it was taken from, the
// payload written in mpNotation as the engine's msgspec encoder lays it
// out. Commands:
//
//	decode                  the input payload, decoded: the batch and each event's fields
//	new [block-size=N]      a fresh index and subscriber (model test-model, default block size 4)
//	apply                   offer the input payload as the next batch; print what the
//	                        subscriber counted and how many blocks the worker holds
//	restart                 the engine restarted (as the live stream shows it): the
//	                        subscriber drops its view, and batches are numbered from 0
//	holds tokens=a,b,… [lora=name] [salt=s] [tier=gpu|host|disk] [group=N] [mm=(id@offset+length,…)]
//	                        whether the worker holds each block of that token
//	                        chain, hashed in the namespace of lora and salt,
//	                        with those multimodal inputs (mm_hash id, its
//	                        placeholders at offset, length long), on that
//	                        tier (default gpu) in that KV-cache group
//	                        (default 0)
//	match tokens=a,b,…      the blocks FindMatches and FindTieredMatches credit
//	                        the worker with for that chain: prefix, host, disk
//	replay                  read one replay-socket message, one frame per input line:
//	                        empty | str "…" | seq N (8 bytes big-endian; -1 ends a replay)
//
// Regenerate the expectations after an intended change with
//
//	go test ./feed -run TestZMQConformance -rewrite
func TestZMQConformance(t *testing.T) {
	datadriven.Walk(t, "testdata/conformance", func(t *testing.T, path string) {
		var sc *conformance
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			switch d.Cmd {
			case "decode":
				var dec VLLMDecoder
				b, err := dec.Decode(mpNotation(t, d.Input))
				if err != nil {
					return "error: " + err.Error() + "\n"
				}
				return dumpBatch(b)
			case "new":
				sc = newConformance(t, d)
				return ""
			case "apply", "restart", "holds", "match":
				if sc == nil {
					d.Fatalf(t, "%s before new", d.Cmd)
				}
				switch d.Cmd {
				case "apply":
					return sc.apply(mpNotation(t, d.Input))
				case "restart":
					return sc.restart()
				case "match":
					return sc.match(t, d)
				}
				return sc.holds(t, d)
			case "replay":
				return dumpReplayReply(t, d)
			}
			d.Fatalf(t, "unknown command %s", d.Cmd)
			return ""
		})
	})
}

func dumpBatch(b *VLLMBatch) string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "ts=%v", b.TS)
	if b.HasDPRank {
		fmt.Fprintf(&sb, " dp_rank=%d", b.DPRank)
	}
	sb.WriteByte('\n')
	for i := range b.Events {
		ev := &b.Events[i]
		fmt.Fprintf(&sb, "%d: ", i)
		if ev.Undecodable {
			fmt.Fprintf(&sb, "undecodable %v: %s\n", ev.Kind, ev.Reason)
			continue
		}
		sb.WriteString(ev.Kind.String())
		field := func(name string, show bool, v any) {
			if show {
				fmt.Fprintf(&sb, " %s=%v", name, v)
			}
		}
		flag := func(name string, set bool) {
			if set {
				sb.WriteString(" " + name)
			}
		}
		field("hashes", ev.Kind != VLLMAllBlocksCleared, ev.Hashes)
		field("parent", ev.HasParent, ev.Parent)
		field("tokens", ev.Kind == VLLMBlockStored, ev.Tokens)
		field("block_size", ev.Kind == VLLMBlockStored, ev.BlockSize)
		flag("bigram", ev.Bigram)
		flag("bad_tokens", ev.BadTokens)
		field("lora_id", ev.LoRAID != 0, ev.LoRAID)
		field("lora_name", ev.LoRAName != nil, strconv.Quote(string(ev.LoRAName)))
		field("salt", ev.Salt != nil, strconv.Quote(string(ev.Salt)))
		field("medium", ev.Medium != nil, string(ev.Medium))
		field("tier", ev.Tier != workers.TierGPU, ev.Tier)
		flag("unknown_medium", ev.UnknownMedium)
		field("locality", ev.Locality != nil, string(ev.Locality))
		field("group", ev.Group != 0, ev.Group)
		field("spec", ev.SpecKind != nil, string(ev.SpecKind))
		field("window", ev.SlidingWindow != 0, ev.SlidingWindow)
		if ev.ExtraKeys != nil {
			var v any
			if err := msgpack.Unmarshal(ev.ExtraKeys, &v); err != nil {
				v = err
			}
			fmt.Fprintf(&sb, " extra_keys=%v from=%d", v, ev.ExtraKeysFrom)
		}
		if ev.MMExtra != nil {
			var mm []int
			for i, e := range ev.MMExtra {
				if e != 0 {
					mm = append(mm, i)
				}
			}
			fmt.Fprintf(&sb, " mm_blocks=%v", mm)
		}
		sb.WriteByte('\n')
	}
	return sb.String()
}

// conformance is one spec's subscriber, fed batch by batch.
type conformance struct {
	s    *ZMQSubscriber
	seq  uint64
	last ZMQStats
}

func newConformance(t *testing.T, d *datadriven.TestData) *conformance {
	bs := testBlockSize
	d.MaybeScanArgs(t, "block-size", &bs)
	s, err := NewZMQSubscriber(newZMQIndex(t), ZMQConfig{Endpoint: "tcp://127.0.0.1:1", Slot: zmqTestSlot,
		Model: testModel, BlockSize: bs})
	if err != nil {
		t.Fatal(err)
	}
	return &conformance{s: s}
}

func (c *conformance) apply(payload []byte) string {
	c.s.offer(c.seq, payload)
	c.seq++
	return c.report()
}

// restart is what the subscriber does when the live stream shows the
// engine restarted (its numbering went back): the engine numbers its
// batches from 0 again.
func (c *conformance) restart() string {
	c.s.restarted()
	c.seq = 0
	return c.report()
}

// report prints what the subscriber counted since the last report, and
// how many blocks the worker holds.
func (c *conformance) report() string {
	st := c.s.Stats()
	delta := []struct {
		name      string
		now, then uint64
	}{
		{"garbage", st.Garbage, c.last.Garbage}, {"stored", st.StoredBlocks, c.last.StoredBlocks},
		{"removed", st.RemovedBlocks, c.last.RemovedBlocks}, {"cleared", st.Cleared, c.last.Cleared},
		{"resyncs", st.Resyncs, c.last.Resyncs}, {"restarts", st.Restarts, c.last.Restarts},
		{"bad_events", st.BadEvents, c.last.BadEvents}, {"unknown_events", st.UnknownEvents, c.last.UnknownEvents},
		{"skipped_lora", st.SkippedLoRA, c.last.SkippedLoRA}, {"skipped_medium", st.SkippedMedium, c.last.SkippedMedium},
		{"skipped_group", st.SkippedGroup, c.last.SkippedGroup},
		{"skipped_extra_keys", st.SkippedExtraKeys, c.last.SkippedExtraKeys},
		{"multimodal_blocks", st.MultimodalBlocks, c.last.MultimodalBlocks},
		{"block_size_mismatch", st.BlockSizeMismatch, c.last.BlockSizeMismatch},
		{"unresolved_parent", st.UnresolvedParent, c.last.UnresolvedParent},
		{"unknown_removed", st.UnknownRemoved, c.last.UnknownRemoved},
		{"reused_engine_hash", st.ReusedEngineHash, c.last.ReusedEngineHash},
	}
	c.last = st
	var sb strings.Builder
	for _, f := range delta {
		if f.now != f.then {
			fmt.Fprintf(&sb, "%s +%d\n", f.name, f.now-f.then)
		}
	}
	fmt.Fprintf(&sb, "worker holds %d blocks\n", c.s.ix.Stats().WorkerBlocks[zmqTestSlot])
	return sb.String()
}

func (c *conformance) holds(t *testing.T, d *datadriven.TestData) string {
	var lora, salt, tier string
	group := 0
	for _, a := range []struct {
		name string
		v    *string
	}{{"lora", &lora}, {"salt", &salt}, {"tier", &tier}} {
		if d.HasArg(a.name) {
			d.ScanArgs(t, a.name, a.v)
		}
	}
	d.MaybeScanArgs(t, "group", &group)
	tr := map[string]workers.Tier{"": workers.TierGPU, "gpu": workers.TierGPU, "host": workers.TierHost, "disk": workers.TierDisk}[tier]
	var sb strings.Builder
	for i, h := range c.chain(t, d, lora, salt) {
		fmt.Fprintf(&sb, "block %d: %v\n", i, c.s.ix.Lookup(radix.KeyspaceHash(h, group, tr)).Has(zmqTestSlot))
	}
	return sb.String()
}

func (c *conformance) match(t *testing.T, d *datadriven.TestData) string {
	hashes := c.chain(t, d, "", "")
	var out workers.Overlaps
	var lower workers.LowerTiers
	c.s.ix.FindMatches(hashes, &out)
	gpu := out[zmqTestSlot]
	c.s.ix.FindTieredMatches(hashes, &out, &lower)
	return fmt.Sprintf("gpu-only prefix %d; tiered prefix %d (host %d, disk %d)\n", gpu, out[zmqTestSlot],
		lower.Blocks(workers.TierHost, zmqTestSlot), lower.Blocks(workers.TierDisk, zmqTestSlot))
}

// chain is the kvfast hashes of the tokens argument's full blocks, in the
// namespace of lora and salt.
func (c *conformance) chain(t *testing.T, d *datadriven.TestData, lora, salt string) []uint64 {
	var arg string
	d.ScanArgs(t, "tokens", &arg)
	var tokens []uint32
	for _, f := range strings.Split(arg, ",") {
		v, err := strconv.ParseUint(f, 10, 32)
		if err != nil {
			d.Fatalf(t, "tokens: %v", err)
		}
		tokens = append(tokens, uint32(v))
	}
	var items []radix.MMItem
	for _, a := range d.CmdArgs {
		if a.Key != "mm" {
			continue
		}
		for _, v := range a.Vals {
			var it radix.MMItem
			id, rng, ok1 := strings.Cut(v, "@")
			off, length, ok2 := strings.Cut(rng, "+")
			var err1, err2 error
			it.ID = []byte(id)
			it.Offset, err1 = strconv.Atoi(off)
			it.Length, err2 = strconv.Atoi(length)
			if !ok1 || !ok2 || err1 != nil || err2 != nil {
				d.Fatalf(t, "mm: want id@offset+length, got %q", v)
			}
			items = append(items, it)
		}
	}
	return radix.AppendBlockHashesMM(nil, radix.NamespaceSeed(c.s.cfg.Model, lora, salt), tokens, c.s.cfg.BlockSize, items)
}

func dumpReplayReply(t *testing.T, d *datadriven.TestData) string {
	var frames [][]byte
	for _, line := range strings.Split(strings.TrimSpace(d.Input), "\n") {
		kind, arg, _ := strings.Cut(strings.TrimSpace(line), " ")
		switch kind {
		case "empty":
			frames = append(frames, []byte{})
		case "str":
			s, err := strconv.Unquote(arg)
			if err != nil {
				d.Fatalf(t, "%s: %v", line, err)
			}
			frames = append(frames, []byte(s))
		case "seq":
			v, err := strconv.ParseInt(arg, 10, 64)
			if err != nil {
				d.Fatalf(t, "%s: %v", line, err)
			}
			frames = append(frames, binary.BigEndian.AppendUint64(nil, uint64(v)))
		default:
			d.Fatalf(t, "unknown frame %q", line)
		}
	}
	seq, payload, ok := replayReply(frames)
	switch {
	case !ok:
		return "not a replay reply\n"
	case seq == endOfReplay && len(payload) == 0:
		return "end of replay\n"
	}
	return fmt.Sprintf("batch seq=%d payload=%q\n", seq, payload)
}
