"""vLLM adapter: publish vLLM's KV-cache events into a kvfast segment.

vLLM hands every batch of KV events (BlockStored, BlockRemoved,
AllBlocksCleared) to an EventPublisher chosen by name from
EventPublisherFactory. This module registers one named "kvfast" that maps
each event onto KvfastPublisher, so the router sees the engine's cache over
shared memory with no ZMQ hop. See README.md for set-up.

Only vllm's own modules are imported, and only inside register(), so this
file can be imported (and tested) without vLLM installed.
"""

import logging
import math
import os
import threading

from kvfast_publisher import KvfastPublisher, Retired, SlotLost, WorkerLive, check_endpoint

_log = logging.getLogger("kvfast")

U64 = (1 << 64) - 1


def engine_hash(h):
    """Fold a vLLM ExternalBlockHash (bytes or int) into 64 bits.

    Bytes become vLLM's own int form of them (maybe_convert_block_hash:
    the low 64 bits of the big-endian integer), as the router's ZMQ feed
    takes them, so that a block named both ways is one key.
    """
    if isinstance(h, (bytes, bytearray, memoryview)):
        return int.from_bytes(bytes(h), "big") & U64
    return int(h) & U64


# HEARTBEAT_WARN_S is half the router's default --heartbeat-grace: a
# longer period leaves no room for one late beat.
HEARTBEAT_WARN_S = 2.5


def _env(name, default=None):
    v = os.environ.get(name)
    return default if v in (None, "") else v


class KvfastEventPublisher:
    """vLLM EventPublisher that writes into a kvfast segment.

    vLLM constructs it with the fields of --kv-events-config as keyword
    arguments plus the data-parallel rank. The segment path comes from
    "endpoint" when it is a file path (e.g. "/dev/shm/kvfast"), else from
    KVFAST_SEGMENT. The rest comes from the environment:
    KVFAST_WORKER_ID (default 0: give each engine on the node its own, or
    the second to start is refused with WorkerLive), KVFAST_MODEL (the
    served model name, required: vLLM does not pass it), KVFAST_BLOCK_SIZE (default 16), KVFAST_ENDPOINT (the engine's
    HTTP address, http://host:port, required),
    KVFAST_KV_BLOCKS, KVFAST_HEARTBEAT_S (default 1).

    The segment need not exist yet: an engine may start before its router
    (a container, a unit without the ordering). The publisher then starts
    unregistered, with _pub None, counts the batches it is given in
    dropped, and registers at the first heartbeat that finds the segment,
    as it does after losing a registration. A misconfiguration (no model
    name, a bad block size, a worker id another live engine holds, a
    segment of another layout) still raises here, where the engine's log
    shows it.
    """

    def __init__(self, data_parallel_rank=0, endpoint=None, attn_dp_rank=None, **_config):
        if attn_dp_rank is not None:
            data_parallel_rank = attn_dp_rank
        path = endpoint if endpoint and endpoint.startswith("/") else _env("KVFAST_SEGMENT", "/dev/shm/kvfast")
        model = _env("KVFAST_MODEL")
        if model is None:
            # vLLM does not hand its publisher the served model name. A
            # worker registered without one is listed under no model, so
            # the router answers 404 to every request for it.
            raise ValueError("kvfast: KVFAST_MODEL is not set: set it to the name clients send as \"model\" "
                             "(vllm serve --served-model-name, else the model given to vllm serve)")
        endpoint_url = _env("KVFAST_ENDPOINT", "")
        try:
            check_endpoint(endpoint_url)
        except ValueError as e:
            # Registered without a usable address, the worker is refused by
            # the router, and only the router's log would say so.
            raise ValueError("kvfast: KVFAST_ENDPOINT: %s: set it to this engine's address as the router reaches it, "
                             "e.g. http://127.0.0.1:8001 for vllm serve --port 8001" % e) from None
        self._dp_rank = int(data_parallel_rank or 0)
        # Read before registering: a bad period must stop the engine with
        # a clear error, not leave a registration that never heartbeats.
        try:
            period = float(_env("KVFAST_HEARTBEAT_S", "1"))
        except ValueError:
            period = math.nan
        if not 0 < period < math.inf:
            raise ValueError("kvfast: KVFAST_HEARTBEAT_S=%r: want a number of seconds above 0 (default 1)"
                             % _env("KVFAST_HEARTBEAT_S"))
        if period >= HEARTBEAT_WARN_S:
            _log.warning("kvfast: KVFAST_HEARTBEAT_S=%g: a router with the default --heartbeat-grace (5 s) takes the "
                         "worker for dead between two beats; keep it well under the router's grace", period)
        self._args = dict(
            path=path,
            worker_id=int(_env("KVFAST_WORKER_ID", "0")),
            model=model,
            block_size=int(_env("KVFAST_BLOCK_SIZE", "16")),
            dp_rank=self._dp_rank,
            kv_capacity_blocks=int(_env("KVFAST_KV_BLOCKS", "0")),
            endpoint=endpoint_url,
        )
        try:
            self._pub = KvfastPublisher(**self._args)
        except FileNotFoundError:
            # No router has created the segment yet. Failing here would
            # stop the engine, which has nothing wrong with it; the
            # heartbeat thread registers once the segment appears.
            _log.warning("kvfast: no segment at %s yet: KV events are dropped until a router creates it", path)
            self._pub = None
        self.skipped = 0  # events kvfast cannot represent (LoRA, extra keys, offload tiers, null blocks, block size)
        self._warned_size = False
        self._warned_group = False
        # Lost: whole batches while no registration was live, and single
        # events that could not be published (bad values).
        self.dropped = 0
        self._warned_live = False
        self._stop = threading.Event()
        self._beat = threading.Thread(target=self._heartbeat, args=(period,), daemon=True, name="kvfast-heartbeat")
        self._beat.start()

    def _heartbeat(self, period):
        # lost: no registration is live, and a new one has not been made
        # (from the start when the segment did not exist yet).
        lost = self._pub is None
        displaced = False  # it went to another registration of this worker id
        while not self._stop.wait(period):
            try:
                if not lost:
                    self._pub.heartbeat()
                    continue
            except (SlotLost, Retired) as e:
                # The router recreated the segment, the file was deleted or
                # replaced, or another registration took the slot: register
                # again so events keep flowing.
                lost, displaced = True, isinstance(e, SlotLost)
                try:
                    self._pub.close(mark_closed=False)
                except Exception:
                    pass
            except Exception:
                continue
            try:
                # Until a router has created the segment anew this fails, and
                # the next beat tries again. After losing the slot to another
                # registration, one that still heartbeats is not taken back.
                pub = KvfastPublisher(displaced=displaced, **self._args)
                if self._stop.is_set():
                    # shutdown() ran meanwhile and closed the publisher it
                    # saw, not this one: release the slot here.
                    pub.close()
                    return
                self._pub = pub
                lost = False
                _log.info("kvfast: registered in %s, slot %d", self._args["path"], pub.slot)
            except WorkerLive as e:
                # Another engine was given this worker id: say so once, and
                # keep trying, in case it is the one that goes.
                if not self._warned_live:
                    self._warned_live = True
                    _log.warning("kvfast: cannot register: %s", e)
            except Exception:
                pass

    def publish(self, events):
        """Map one vLLM KVEventBatch onto kvfast records. Never blocks, and
        never raises into the engine: while the registration is lost (the
        heartbeat thread makes a new one), or before the segment exists, the
        events are dropped and counted, and the router resyncs the worker
        when it registers."""
        try:
            if self._pub is None:  # not registered yet: no segment so far
                self.dropped += 1
                return
            self._publish(events)
        except Exception:
            self.dropped += 1

    def _publish(self, events):
        pub = self._pub
        for ev in getattr(events, "events", events):
            # One event at a time: a bad one costs itself, not the removals
            # after it in the batch (which the router would otherwise
            # never hear of, and go on claiming the evicted blocks).
            try:
                self._publish_event(pub, ev)
            except SlotLost:
                raise
            except Exception:
                if pub._closed or pub is not self._pub:
                    # The registration went (the heartbeat closed or
                    # replaced it), not the event: the batch is lost whole.
                    raise
                self.dropped += 1
                if type(ev).__name__ != "BlockStored":
                    # A removal that did not reach the router leaves it
                    # claiming blocks the engine dropped; clearing the
                    # worker's view is the truth it can still tell. A lost
                    # store only under-claims.
                    pub.cleared()

    def _publish_event(self, pub, ev):
        name = type(ev).__name__
        medium = getattr(ev, "medium", None)
        if medium not in (None, "GPU", "gpu"):
            self.skipped += 1  # CPU/disk offload tiers are not the engine's device cache
            return
        if getattr(ev, "group_idx", None) not in (None, 0):
            # A hybrid model's other KV-cache groups (sliding window,
            # mamba) send their own stores and removals of the same block
            # hashes; a shared-memory record cannot say which group it is
            # about, and published as one group, a block the full-attention
            # group evicted stayed claimed while another group's copy stood.
            # Only group 0 is published.
            if not self._warned_group:
                self._warned_group = True
                _log.warning("kvfast: the engine runs a hybrid model (KV events of group %s): the shared-memory "
                             "publisher follows its full-attention group only, and the router cannot see a sliding "
                             "window's evictions; for exact credit use vLLM's ZMQ KV-event feed instead "
                             "(--worker ...,zmq=tcp://HOST:PORT)", getattr(ev, "group_idx", None))
            self.skipped += 1
            return
        if name == "BlockStored":
            if getattr(ev, "lora_id", None) is not None or getattr(ev, "lora_name", None) is not None:
                # kvfast seeds LoRA namespaces by adapter name, which the
                # event does not carry (or a shared-memory record cannot).
                self.skipped += 1
                return
            if any(k is not None for k in getattr(ev, "extra_keys", None) or ()):
                # The engine hashed these blocks with more than their
                # tokens (a multimodal item's hash, a cache salt, prompt
                # embeddings), which a shared-memory record cannot carry:
                # stored as plain tokens they would match a request with
                # another image or salt, a claim the engine cannot honour.
                # Skipped: an under-claim (the ZMQ feed hashes them).
                self.skipped += 1
                return
            if ev.block_size != pub.block_size:
                if not self._warned_size:
                    self._warned_size = True
                    _log.warning("kvfast: the engine stores blocks of %s tokens and KVFAST_BLOCK_SIZE is %d: "
                                 "its blocks are skipped, and the router routes to it without cache credit; set "
                                 "KVFAST_BLOCK_SIZE (and the router's --block-size) to vLLM's --block-size",
                                 ev.block_size, pub.block_size)
                self.skipped += 1
                return
            if len(ev.token_ids) != len(ev.block_hashes) * pub.block_size:
                # vLLM leaves out a sliding-window or mamba group's null
                # blocks (and, in later releases, blocks that were cached
                # already) while token_ids still covers them. The blocks
                # it names chain through those tokens, which a shared-memory
                # record cannot express: skipped, an under-claim (the ZMQ
                # feed stores them).
                self.skipped += 1
                return
            parent = ev.parent_block_hash
            pub.stored([engine_hash(h) for h in ev.block_hashes], ev.token_ids,
                       None if parent is None else engine_hash(parent))
        elif name == "BlockRemoved":
            pub.removed([engine_hash(h) for h in ev.block_hashes])
        elif name == "AllBlocksCleared":
            pub.cleared()
        else:
            self.skipped += 1

    def shutdown(self):
        self._stop.set()
        self._beat.join(timeout=2)
        if self._pub is not None:  # None: it never registered
            self._pub.close()


def register():
    """Register the "kvfast" publisher with vLLM's factory.

    Works as a vLLM general plugin (entry point group vllm.general_plugins),
    which vLLM calls in every engine process, or called by hand before the
    engine starts.
    """
    from vllm.distributed.kv_events import EventPublisher, EventPublisherFactory

    class KvfastVllmPublisher(KvfastEventPublisher, EventPublisher):
        def __init__(self, *args, **kwargs):
            rank = kwargs.get("data_parallel_rank", kwargs.get("attn_dp_rank", 0))
            try:
                EventPublisher.__init__(self, rank)
            except TypeError:  # older vLLM: no rank argument
                EventPublisher.__init__(self)
            KvfastEventPublisher.__init__(self, *args, **kwargs)

    try:
        EventPublisherFactory.register_publisher("kvfast", KvfastVllmPublisher)
    except KeyError:
        pass  # already registered in this process
