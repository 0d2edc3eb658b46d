"""Setting up an event kernel for one run (cold code, run once): validate the arguments, derive
the rates, and allocate every array of the state (docs/simulator.md section 9). The kernel's
``Engine.__init__`` calls :func:`init_engine`; the compiled core's attributes are all ``public``
(engine.pxd), so plain Python can set them."""

from __future__ import annotations

import functools
import math
import random

import numpy as np

from fluidopt.control.protocol import NO_REQUEST, Controller
from fluidopt.core.errors import ScenarioError
from fluidopt.core.model import Scenario
from fluidopt.sim import metrics as M
from fluidopt.sim import state as S
from fluidopt.sim.prefix_cache import make_prefix_cache
from fluidopt.sim.state import G_OFFLINE, G_ONLINE, REQUEST_FIELDS
from fluidopt.sim.timelaw import law_coefficients
from fluidopt.sim.window import RunWindow

__all__ = ["init_engine", "set_slo"]

INF = math.inf
NQ, NC = M.N_CLASS_QTY, M.N_CTR


def init_engine(
    eng,
    typed: bool,
    gpuset,
    scenario: Scenario,
    controller: Controller,
    workload,
    *,
    window: RunWindow,
    seed: int = 0,
    records=None,
    progress: bool = False,
    batches: int = 20,
    check: bool = False,
    arrival_chunk: int = 65536,
    prefix_cache: bool | None = None,
) -> None:
    """Set engine ``eng`` up for one run (see :func:`fluidopt.sim.api.simulate` for the arguments).
    ``typed``: the state is typed arrays (the compiled core); ``gpuset``: the kernel's GpuSet class;
    ``window``: the run's window, checked when it was made (read here as it is)."""
    ints = functools.partial(S.ints, typed=typed)
    floats = functools.partial(S.floats, typed=typed)
    doubles = functools.partial(S.doubles, typed=typed)
    if not isinstance(scenario, Scenario):
        raise ScenarioError(f"simulate: scenario: expected a Scenario, got {type(scenario).__name__}")
    if not isinstance(window, RunWindow):
        raise ScenarioError(f"simulate: window: expected a fluidopt.sim.window.RunWindow, got {type(window).__name__}")
    service, sample_interval, drain = window.service, window.sample_interval, window.drain
    if not isinstance(controller, Controller):
        raise ScenarioError(
            f"simulate: controller: expected a fluidopt.control.protocol.Controller, got {type(controller).__name__}"
        )
    eng.scenario = scenario
    eng.controller = controller
    eng.workload = workload
    eng._service = service
    eng.horizon = window.horizon
    eng.warmup = window.warmup
    eng.seed = int(seed)
    eng.check = bool(check)
    gpu = scenario.gpu
    eng.n = n = scenario.gpus
    eng.B = gpu.batch
    eng.I = I = scenario.n_classes
    eng._class_names = scenario.class_names
    eng.C = gpu.chunk
    eng.alpha, eng.beta = gpu.alpha, gpu.beta
    eng.tau_mix = gpu.tau_mix
    eng.tau_solo = gpu.tau_solo
    eng.kap = float(gpu.kv_time_per_token)
    eng.kvcap = -1 if gpu.kv_capacity is None else int(math.floor(gpu.kv_capacity))
    if service == "markov" and (gpu.kv_capacity is not None or gpu.kv_time_per_token):
        raise ScenarioError(
            "simulate: service='markov' has no KV-cache model (gpu.kv_capacity / gpu.kv_time_per_token are "
            "set); use service='tokens'"
        )
    eng.markov = service == "markov"
    # the generalised law (timelaw.py): t_itl, l_q and l_last per GPU, set from its state by Engine._law_set
    law = gpu.timemodel
    if law is not None and eng.markov:
        raise ScenarioError("simulate: service='markov' runs the straight line; gpu.timemodel (the generalised "
                            "iteration-time law) needs service='tokens'")
    eng._law = law is not None
    eng._lin = eng.kap == 0.0 and not eng._law
    eng._lawc = None if law is None else law_coefficients(law, gpu.chunk)
    eng.l_q, eng.l_last = doubles([0.0] * scenario.gpus), doubles([0.0] * scenario.gpus)
    eng.l_w = S.ints(scenario.gpus, 0, typed=typed)
    eng.chunked = bool(getattr(controller, "chunked_prefill", True))

    # -- random streams: workload, engine, controller (independent children of one seed) ------
    ss = np.random.SeedSequence(eng.seed)
    s_work, s_eng, s_ctrl = ss.spawn(3)
    eng._work_rng = np.random.default_rng(s_work)
    eng._np_rng = np.random.default_rng(s_eng)
    eng._ctrl_rng = random.Random(int(s_ctrl.generate_state(1, dtype=np.uint64)[0]))
    eng._exp_block = floats(0, 0.0)
    eng._exp_i = 0
    eng._uni_block = floats(0, 0.0)
    eng._uni_i = 0

    # -- rates ---------------------------------------------------------------------------------
    rates = scenario.rates()
    P = np.array([c.prompt for c in scenario.classes], dtype=float)
    mu_p = [float(x) for x in rates.mu_p]
    mu_m = [float(x) for x in rates.mu_m]
    if not eng.chunked:
        # vLLM prefill-first without chunking: one iteration of alpha + beta * P for the whole
        # prompt, decodes stalled meanwhile (see Controller.chunked_prefill).
        mu_p = [float(x) for x in 1.0 / (gpu.alpha + gpu.beta * P)]
        mu_m = [0.0] * I
    mu_s = [float(x) for x in rates.mu_s]
    eng.theta = doubles(rates.theta)
    eng.mu_p = doubles(mu_p)
    eng.mu_m = doubles(mu_m)
    eng.mu_s = doubles(mu_s)
    eng.mbar = doubles([max(a, b) for a, b in zip(mu_m, mu_s)])
    cp, cd = scenario.class_prices()
    eng._cp = [float(x) for x in cp]
    eng._cd = [float(x) for x in cd]
    eng._mean_prompt = [float(c.prompt) for c in scenario.classes]
    eng._mean_output = [float(c.decode) for c in scenario.classes]

    # -- per-request state (recycled slots) ----------------------------------------------------
    eng._free: list[int] = []
    eng._rows = None
    if typed:  # one row per request, each field a strided view (state.py)
        S.set_typed_state(eng, "_rows", REQUEST_FIELDS, S.REQUEST_ROW, 0, S.REQUEST_FILL)
    else:
        for name, kind, _, _ in REQUEST_FIELDS:
            setattr(eng, name, ints(0, 0) if kind is int else floats(0, 0.0))
    eng._serial = 0
    eng._seq_back = 0
    eng._seq_front = 0

    # -- the exponential race's request sets (swap-remove) ---------------------------------------
    # segment s = kind * I + class (kinds RACE_WAIT: queued, RACE_PREFILL / RACE_DECODE: markov in
    # service) holds _rsn[s] pairs (request, its GPU or -1 while it waits), the k-th at
    # _rs[_rsoff[s] + 2 * k] (r_pos: r's k), with room for _rscap[s] pairs (each segment grows alone)
    cap0 = 64  # pairs per segment at first
    eng._rscap = ints(3 * I, cap0)
    eng._rsoff = ints(3 * I, 0)
    for s in range(3 * I):
        eng._rsoff[s] = 2 * cap0 * s
    eng._rs = S.pairs(2 * cap0 * 3 * I, -1, typed)
    eng._rsn = ints(3 * I, 0)
    eng._lam = 0.0  # total race rate
    # each race segment's rate per request: theta (waiting), mu_p (prefill), mbar (decode), by class
    eng._rrate = doubles(list(rates.theta) + mu_p + [max(a, b) for a, b in zip(mu_m, mu_s)])

    # -- counts (time-integrated by the "sum of signed change times" trick) -------------------
    nq = NQ * I + M.N_GPU_QTY
    eng._cnt = ints(nq, 0)
    eng._acc = floats(nq, 0.0)
    eng._gbase = NQ * I
    eng._ctr = ints(NC * I, 0)

    # -- GPUs -----------------------------------------------------------------------------------
    # per-GPU fields (state.GPU_FIELDS): their initial values
    gpu0 = {"g_pre": NO_REQUEST, "g_ndec": 0, "g_cnt": 0, "g_pool": 0, "g_pok": 1, "g_maxd": eng.B, "g_state": G_ONLINE,
            "_isdirty": 0, "t_ka": 0, "t_dca": 0, "t_kv": 0, "t_adv": 1, "t_pend": -1, "t_pkb": -1, "t_ta": 0.0,
            "t_itl": eng.tau_solo}
    eng._gpu_rows = None
    if typed:
        S.set_typed_state(eng, "_gpu_rows", S.GPU_FIELDS, S.GPU_ROW, n, gpu0)
    else:
        for name, kind, _ in S.GPU_FIELDS:
            setattr(eng, name, ints(n, gpu0[name]) if kind is int else floats(n, float(gpu0[name])))
    eng.g_dcls = ints(n * I, 0)  # decodes on g by class: g_dcls[g * I + c]
    # the requests decoding on g: g_dec[g*B : g*B + g_ndec[g]]; in tokens mode that segment is a
    # binary min-heap keyed by (r_dkey[r], r), r_dkey[r] being the value of g's decode clock at which
    # r's decode ends and r_dpos[r] r's index in g_dec (markov mode keeps no positions: it scans)
    eng.g_dec = ints(n * eng.B, -1)
    eng._n_pools = 1
    rand = eng._ctrl_rng.random
    eng._ip = [gpuset(n, rand)]
    eng._fd = [gpuset(n, rand)]
    for g in range(n):
        eng._ip[0]._add(g)
        eng._fd[0]._add(g)
    # the fleet: GPU-seconds = _fleet_on * t - _fleet_acc (GPUs counted: online, starting, draining)
    eng._fleet_on = n
    eng._fleet_acc = 0.0
    eng._fleet_log = [(0.0, n, n)]  # (time, GPUs counted, GPUs online) after each change
    eng._saved = {}  # GPU -> (prefill allowed, max decodes) while it is not online
    fleet = scenario.fleet
    eng._fleet_used = fleet is not None
    eng._startup = 0.0 if fleet is None else float(fleet.startup_delay)
    eng._swap = 0.0 if fleet is None else float(fleet.kv_swap_time_per_token)
    # tokens mode (the GPU rows above hold its per-GPU clock)
    eng.t_pte = floats(n, 0.0)  # its time
    # pending GPU events: a binary min-heap of GPU ids (at most one entry per GPU) keyed by
    # (t_pte[g], g), with each GPU's position in _hpos (-1: none); the event's boundary is t_pkb[g]
    eng._hq = ints(n, -1)
    eng._hpos = ints(n, -1)
    eng._hn = 0
    eng._dirty: list[int] = []

    if fleet is not None and fleet.initial is not None:
        for g in range(fleet.initial, n):
            eng._saved[g] = (1, eng.B)
            eng.g_state[g] = G_OFFLINE
            eng.g_pok[g] = 0
            eng.g_maxd[g] = 0
            eng._refresh(g)
        eng._fleet_on = fleet.initial
        eng._fleet_log = [(0.0, fleet.initial, fleet.initial)]

    # -- queues ---------------------------------------------------------------------------------
    eng._qnames: list[str] = ["prefill", "decode"] + [f"instance[{g}]" for g in range(n)]
    eng._qindex = {nm: q for q, nm in enumerate(eng._qnames)}
    nqueues = len(eng._qnames)
    eng.q_head = ints(nqueues * I, -1)
    eng.q_tail = ints(nqueues * I, -1)
    eng.q_cnt = ints(nqueues * I, 0)
    eng.q_tot = ints(nqueues, 0)

    # -- time, arrivals, housekeeping -----------------------------------------------------------
    eng._now = 0.0
    eng._in_setup = False
    eng._events = 0
    eng._arr_t = floats(0, 0.0)  # the current batch of arrivals: times, classes, prompt and output tokens
    eng._arr_c = ints(0, 0)
    eng._arr_p = ints(0, 0)
    eng._arr_o = ints(0, 0)
    eng._ai = 0
    eng._arr_iter = None
    eng._arrival_chunk = int(arrival_chunk)
    eng._t_race = INF  # the race clock: time of the next race event
    eng._lam_race = 0.0  # the rate it was drawn with
    eng._nd = 0
    eng._started = False
    eng._done = False  # the horizon was reached
    eng._pause = False
    eng._finished = False  # finish() returned the result
    # advance() turns the first Ctrl-C into a clean stop between events. A driver that calls
    # advance() thousands of times a second (a Gymnasium environment) sets this False: two
    # signal-handler swaps per call cost more than its steps, and Ctrl-C then raises at once.
    eng.handle_sigint = True
    eng._wall0 = 0.0
    eng._next_report = 0.0
    eng.engine_name = "compiled" if typed else "python"
    eng.collector = M.MetricCollector(I, eng.warmup, eng.horizon, batches)
    eng._bounds = [eng.warmup + j * eng.collector.L for j in range(batches)] + [eng.horizon]
    if any(c.has_slo for c in scenario.classes):
        set_slo(eng, scenario)
    eng._bi = 0
    eng.sample_interval = sample_interval
    eng._t_sample = 0.0 if sample_interval else INF
    eng._samples: list[list[float]] = []
    eng.tick_interval = getattr(controller, "tick_interval", None)
    eng._t_tick = float(eng.tick_interval) if eng.tick_interval else INF
    # finished requests' rows (_NREC fields each, as floats) waiting to be folded into the metrics
    eng._rec = floats(S.FLUSH * M.N_RECORD_FIELDS, 0.0)
    eng._nrec = 0
    eng._records = records
    eng.progress = progress
    eng._interrupted = False
    eng._stop = False  # set by the first Ctrl-C: stop between two events
    if drain is not None:  # go on past the horizon until the window's arrivals resolve
        from fluidopt.sim.cohort import make_tracker

        eng.collector.cohort = make_tracker(eng, drain)

    # callbacks (skip the ones a controller leaves as no-ops)
    base = Controller
    ct = type(controller)
    eng._cb_arrival = controller.on_arrival if ct.on_arrival is not base.on_arrival else None
    eng._cb_pdone = controller.on_prefill_done if ct.on_prefill_done is not base.on_prefill_done else None
    eng._cb_ddone = controller.on_decode_done if ct.on_decode_done is not base.on_decode_done else None
    eng._cb_abandon = controller.on_abandon if ct.on_abandon is not base.on_abandon else None
    eng._cb_preempt = controller.on_preempt if ct.on_preempt is not base.on_preempt else None
    eng._cb_drop = controller.on_drop if ct.on_drop is not base.on_drop else None
    eng._cb_freed = controller.on_slot_freed if ct.on_slot_freed is not base.on_slot_freed else None
    # the prefix cache: on when the workload carries block hashes in tokens mode, unless prefix_cache=False
    if prefix_cache not in (None, True, False):
        raise ScenarioError(f"simulate: prefix_cache: expected True, False or None (on with block hashes), got {prefix_cache!r}")
    eng._pc = make_prefix_cache(workload, n, I, eng.kvcap, service, prefix_cache, eng.C, eng.chunked, typed)
    eng._pch = eng._pc if eng._pc is not None and eng.kvcap >= 0 else None  # holds and evicts blocks

# =============================================================================================


def set_slo(eng, scenario: Scenario) -> None:
    """Have the collector count per-class SLO attainment (only when some class has an SLO)."""
    from fluidopt.sim.results import min_service_time

    def lim(v):
        return [INF if getattr(c, v) is None else float(getattr(c, v)) for c in scenario.classes]

    eng.collector.set_slo(lim("ttft_slo"), lim("itl_slo"), lim("deadline"), lim("deadline_at"),
                          functools.partial(min_service_time, scenario.gpu, eng.chunked))
