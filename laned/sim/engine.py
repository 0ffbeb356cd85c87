"""The simulated engine's behaviour: vLLM's endpoints, pacing, metrics and failure modes.

One Engine per process. Requests are admitted up to max_num_seqs (the rest wait, as in
vLLM's scheduler), prefill is paced at the configured prefill rate for the tokens the
prefix cache does not already hold, and decode at the configured rate per stream.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import time
import uuid
from collections.abc import AsyncGenerator, Callable
from typing import Any

from laned.errors import EngineDead
from laned.sim import answers, faults, gpu, responses, sglang, sleep
from laned.sim.http import Request, Response
from laned.sim.metrics import Metrics
from laned.sim.responses import Job, error
from laned.sim.settings import Settings
from laned.sim.startup import log
from laned.sim.steps import DecodeSteps

VERSION = "0.11.0+laned.sim"
BLOCK = 16  # tokens per KV block, for prefix-cache accounting
LONG_ANSWER_TOKENS = 200
WATCHDOG_SECONDS = 5.0  # VLLM_WATCHDOG_TIME_S in vllm/entrypoints/launcher.py (a constant)  # length of a "write an essay" answer when the request sets no cap


class Engine:
    """The simulated engine: state, routes, and faults."""

    def __init__(self, settings: Settings, on_exit: Callable[[int, float], None]) -> None:
        self.settings = settings
        self.on_exit = on_exit
        self.metrics = Metrics(
            settings.name,
            settings.num_spec_tokens > 0,
            settings.num_spec_tokens,
            legacy=settings.legacy_metrics,
        )
        self.dead = False
        self.warmed = True  # SGLang's face: /health is 503 until its warmup request is done
        self.closing = False  # draining after SIGTERM: new requests fail (vLLM 0.32)
        self.stalled = False
        self.cached_blocks: set[str] = set()
        self.kv_tokens = 0
        self.slot_free = asyncio.Condition()
        self.started = time.time()
        self.serving_since = time.monotonic()  # the watchdog's clock starts with the server
        self.steps = DecodeSteps(settings.decode_tps, self.serving_since)  # one for all
        self.aborts = 0  # each sleep with mode=abort ends the requests in flight
        self.sleep = sleep.Sleep(
            settings.weights_gib if settings.enable_sleep_mode else 0.0,
            settings.reload_gibps,
            lambda: self.metrics.running,
            self._abort_all,
            self._slept,
            self._move_gpu_memory
            if settings.enable_sleep_mode and (settings.hold_gpu_gib or settings.sim_gpus)
            else None,
        )
        self.metrics.extra = self.sleep.metric_lines

    # --- routing ---------------------------------------------------------------------

    async def handle(self, request: Request) -> Response:
        """Route one request."""
        route = (request.method, request.path)
        if request.path not in ("/health", "/metrics"):
            log("INFO", "api_server.py:1", f'"{request.method} {request.path} HTTP/1.1"')
        if self.settings.face == "sglang" and (answer := await sglang.route(self, request)):
            return answer
        if route == ("GET", "/health"):
            return Response(503 if self.dead else 200, b"", "application/json")
        if route == ("GET", "/version"):
            return Response.json({"version": VERSION})
        if route == ("GET", "/metrics"):
            return Response.text(
                self.metrics.render(), content_type="text/plain; version=0.0.4; charset=utf-8"
            )
        if route == ("POST", "/sim/fault"):
            return faults.inject(self, request)
        if route in sleep.ROUTES and self.settings.dev_mode:
            return await self.sleep.handle(request)
        if route == ("GET", "/sim/state"):
            return Response.json(self._state())
        if route == ("POST", "/tokenize"):
            return self._tokenize(request)
        if request.path.startswith("/v1/"):
            denied = self.authorize(request)
            if denied is not None:
                return denied
            if route == ("GET", "/v1/models"):
                return Response.json(self._models())
            if route == ("POST", "/v1/chat/completions"):
                return await self._completion(request, chat=True)
            if route == ("POST", "/v1/completions"):
                return await self._completion(request, chat=False)
        known = ("/health", "/version", "/metrics", "/tokenize", "/v1/models", "/v1/completions")
        if request.path in (*known, "/v1/chat/completions"):
            return Response.json({"detail": "Method Not Allowed"}, 405)
        return Response.json({"detail": "Not Found"}, 404)

    def authorize(self, request: Request) -> Response | None:
        """401 for a request without the engine's key, where it has one."""
        key = self.settings.api_key
        if not key:
            return None
        given = request.headers.get("authorization", "")
        if hmac.compare_digest(given.encode(), f"Bearer {key}".encode()):
            return None
        return Response.json({"error": "Unauthorized"}, 401)

    def _models(self) -> dict[str, Any]:
        s = self.settings
        if s.face == "sglang":
            return {"object": "list", "data": [sglang.models_entry(s, self.started)]}
        return {
            "object": "list",
            "data": [
                {
                    "id": s.name,
                    "object": "model",
                    "created": int(self.started),
                    "owned_by": "vllm",
                    "root": s.model,
                    "parent": None,
                    "max_model_len": s.max_model_len,
                }
            ],
        }

    def _state(self) -> dict[str, Any]:
        return {
            "model": self.settings.model,
            "served_model_name": self.settings.name,
            "max_model_len": self.settings.max_model_len,
            "generation_defaults": self.settings.generation.defaults,
            "generation_source": self.settings.generation.source,
            "stop_ids": sorted(self.settings.generation.stop_ids),
            "turn_end_id": self.settings.generation.turn_end,
            "decode_tps": self.settings.decode_tps,
            "prefill_tps": self.settings.prefill_tps,
            "unknown_flags": self.settings.unknown,
            "dead": self.dead,
            "stalled": self.stalled,
            "running": self.metrics.running,
            "waiting": self.metrics.waiting,
        }

    def _tokenize(self, request: Request) -> Response:
        """vLLM's POST /tokenize (vllm/entrypoints/serve/tokenize/), outside /v1."""
        try:
            return Response.json(answers.tokenize(request.json(), self.settings.max_model_len))
        except (ValueError, KeyError, TypeError, AttributeError):
            return error("expected a JSON body with `prompt` or `messages`", 400)

    # --- faults ----------------------------------------------------------------------

    def die(self, why: str) -> None:
        """The engine core dies (a node rank went away): /health fails, then the server exits."""
        if self.dead:
            return
        log("ERROR", "multiproc_executor.py:1", f"{why}: the collective across the nodes failed")
        self.dead = True
        self.log_engine_death()

    def log_engine_death(self) -> None:
        if self.settings.face == "sglang":
            sglang.die()
            return
        # vLLM 0.32's lines as its core's death reaches its API server (its CPU build here,
        # EngineCore SIGKILLed: /health 503 0.1 s later): the core client's monitor thread
        # (vllm/v1/engine/core_client.py monitor_engine_cores, start_engine_core_monitor),
        # then the output handler's failure (vllm/v1/engine/async_llm.py output_handler).
        log(
            "WARNING",
            "core_client.py:817",
            "[shutdown] MPClient: engine core exited unexpectedly; starting cleanup",
        )
        log("INFO", "core_client.py:777", "[shutdown] MPClient: complete")
        log("ERROR", "async_llm.py:906", "AsyncLLM output_handler failed.")
        log(
            "ERROR",
            "async_llm.py:906",
            "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. "
            "See stack trace (above) for the root cause.",
        )
        # vLLM's API server then shuts itself down and exits with status 0 (vLLM #48966) at
        # its watchdog's next look, every 5 s (watchdog_loop, vllm/entrypoints/launcher.py).
        since = (time.monotonic() - self.serving_since) % WATCHDOG_SECONDS
        asyncio.get_running_loop().call_later(WATCHDOG_SECONDS - since, self._terminate)

    def _terminate(self) -> None:
        """terminate_if_errored: exit 0 once the engine is dead, unless told to stay up."""
        if self.dead and not self.settings.keep_alive_on_engine_death:
            self.on_exit(0, 0.0)

    # --- completions -----------------------------------------------------------------

    async def _completion(self, request: Request, chat: bool) -> Response:
        if self.closing:
            # Draining (--shutdown-timeout): vLLM 0.32 still listens, /health and /metrics
            # answer 200, and a new request fails with this (seen on the CPU build).
            return error("cannot schedule new futures after shutdown", 500, "InternalServerError")
        if self.dead:
            # A request that meets the dead engine ends the server at once (its exception
            # handler calls terminate_if_errored), after the answer.
            failed = error(
                "EngineCore encountered an issue. See stack trace for the root cause.",
                500,
                "EngineDeadError",
            )
            failed.after = self._terminate
            return failed
        try:
            body = request.json()
        except ValueError:
            return error("request body is not valid JSON", 400)
        if not isinstance(body, dict):
            return error("request body must be a JSON object", 400)
        s = self.settings
        if body.get("model") not in (None, s.name):
            return error(f"The model `{body.get('model')}` does not exist.", 404, "NotFoundError")
        call_id = f"chatcmpl-tool-{uuid.uuid4().hex[:16]}"
        if chat:
            messages = body.get("messages")
            if (
                not isinstance(messages, list)
                or not all(isinstance(m, dict) for m in messages)
                or not messages
            ):
                return error("messages must be a non-empty list of message objects", 400)
            tools = body.get("tools") if isinstance(body.get("tools"), list) else None
            kwargs = {**s.chat_template_kwargs, **(body.get("chat_template_kwargs") or {})}
            thinking = bool(kwargs.get("thinking", kwargs.get("enable_thinking", False)))
            prompt_tokens = answers.chat_prompt_tokens(messages, tools)
            prompt_text = "\n".join(answers.message_text(m) for m in messages)
            tool_choice = body.get(
                "tool_choice", "auto" if (tools and s.auto_tool_choice) else "none"
            )
            answer = answers.compose_chat(messages, tools, tool_choice, thinking, s.name, call_id)
        else:
            prompt = body.get("prompt")
            if isinstance(prompt, list):
                prompt = " ".join(str(p) for p in prompt)
            if not isinstance(prompt, str):
                return error("prompt must be a string", 400)
            thinking = False
            prompt_tokens = answers.count_prompt_tokens(prompt) + 1
            prompt_text = prompt
            answer = answers.compose_text(prompt, prompt, False, s.name)
        max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
        if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens < 1):
            return error("max_tokens must be a positive integer", 400)
        requested = max_tokens or 0
        if prompt_tokens + requested > s.max_model_len:
            return error(
                f"This model's maximum context length is {s.max_model_len} tokens. However, you requested "
                f"{prompt_tokens + requested} tokens ({prompt_tokens} in the messages, {requested} in the "
                "completion). Please reduce the length of the messages or completion.",
                400,
            )
        limit = max_tokens or (s.max_model_len - prompt_tokens)
        if answer.long and max_tokens is None:
            # A long text with no cap ends on its own, as a model's essay does.
            limit = min(limit, LONG_ANSWER_TOKENS)
            answer.long = False
            answer.content = " ".join([answer.content.strip()] * (LONG_ANSWER_TOKENS // 40))
        runs_on = chat and not s.generation.turn_stops
        parser = s.reasoning_parser
        pieces = answers.pieces(
            answer, thinking, parser, limit, bool(body.get("ignore_eos")), runs_on
        )
        job = Job(
            prompt_text, prompt_tokens, pieces[:limit], answer.tool_calls, len(pieces) > limit
        )
        job.token_ids = bool(body.get("return_token_ids"))
        if body.get("stream"):
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            return Response(
                200,
                content_type="text/event-stream",
                stream=responses.stream(
                    self._run(job), job, chat, include_usage, self.settings.name
                ),
            )
        return await responses.collect(self._run(job), job, chat, self.settings.name)

    async def _admit(self) -> float:
        """Wait for a running slot (max_num_seqs); return the time spent waiting."""
        queued = time.monotonic()
        async with self.slot_free:
            self.metrics.waiting += 1
            try:
                await self.slot_free.wait_for(
                    lambda: (
                        not self.stalled
                        and not self.sleep.paused
                        and self.metrics.running < self.settings.max_num_seqs
                    )
                )
            finally:
                self.metrics.waiting -= 1
            self.metrics.running += 1
        return time.monotonic() - queued

    async def _release(self) -> None:
        async with self.slot_free:
            self.metrics.running -= 1
            self.slot_free.notify_all()

    def _cache_lookup(self, text: str) -> int:
        """Tokens of this prompt already in the prefix cache; caches the rest."""
        tokens = answers.prompt_token_list(text)
        digest = hashlib.sha256()
        hits, still_hitting = 0, True
        for start in range(0, len(tokens) - len(tokens) % BLOCK, BLOCK):
            digest.update("\x00".join(tokens[start : start + BLOCK]).encode())
            key = digest.hexdigest()
            if still_hitting and key in self.cached_blocks:
                hits += BLOCK
            else:
                still_hitting = False
                self.cached_blocks.add(key)
        return hits

    async def _hold_if_stalled(self) -> None:
        # A wedged engine: nothing moves, /health still answers 200 (vLLM #39863).
        while self.stalled:
            await asyncio.sleep(3600)
        await self.sleep.awake.wait()  # asleep with mode=keep: frozen until the wake

    def _abort_all(self) -> None:
        self.aborts += 1

    def _move_gpu_memory(self, move: str) -> None:
        """What a sleep or a wake does to the GPU memory held (LANED_SIM_HOLD_GPU_GIB):
        level 1 copies it to pinned host memory and back, level 2 drops it and takes it again."""
        root = self.settings.sim_gpus
        if root:  # a simulated host: a sleep keeps the context only, a wake takes all again
            asleep = move in ("offload", "discard")
            held = self.settings.sim_held
            gpu.sim_write(root, {g: int(gpu.RESIDUAL) for g in held} if asleep else held)
        if not self.settings.hold_gpu_gib:
            return  # no real GPU memory held: nothing to move
        if move == "offload":
            gpu.offload()
        elif move == "restore":
            gpu.restore()
        elif move == "discard":
            gpu.release()
        else:
            gpu.hold(self.settings.hold_gpu_gib)

    def _slept(self, asleep: bool) -> None:
        """Sleep mode: the requests waiting for the wake may be admitted."""

        async def admit() -> None:
            async with self.slot_free:
                self.slot_free.notify_all()

        if not asleep:
            asyncio.get_running_loop().create_task(admit())

    async def _run(self, job: Job) -> AsyncGenerator[tuple[str, str], None]:
        """Admit, prefill in chunks, then yield the pieces at the decode rate, counting as
        vLLM counts (vllm/v1/metrics/stats.py): a generated token at its step, the prompt's
        tokens only when its prefill ends, and every engine step in iteration_tokens_total
        (a prefill-only chunk as 0). So during a long prefill the token counters stay flat
        while the step count and the KV-cache usage grow."""
        s, m = self.settings, self.metrics
        prompt_tokens, pieces = job.prompt_tokens, job.pieces
        arrived = time.monotonic()
        queue_time = await self._admit()
        emitted, reason, held, aborts = 0, "abort", 0, self.aborts
        prefill_start = decode_start = arrived
        try:
            hits = min(self._cache_lookup(job.prompt_text), prompt_tokens)
            m.add("prefix_cache_queries", prompt_tokens)
            m.add("prefix_cache_hits", hits)
            prefill_start = time.monotonic()
            held = self._hold_kv(hits)  # cached blocks are the request's at once
            todo = prompt_tokens - hits
            while todo > 0:  # chunked prefill: one engine step per --max-num-batched-tokens
                await self._hold_if_stalled()
                if self.dead:
                    raise EngineDead(
                        "the engine core is dead (fault injected)", "restart the engine"
                    )
                chunk = min(todo, s.max_num_batched_tokens)
                await asyncio.sleep(chunk / s.prefill_tps)
                todo -= chunk
                held += self._hold_kv(chunk)
                if todo > 0:
                    m.observe("iteration_tokens_total", 0)  # no output yet: no token counted
            decode_start = time.monotonic()
            last, step = decode_start, None
            for index, piece in enumerate(pieces):
                await self._hold_if_stalled()
                if self.dead:
                    raise EngineDead(
                        "the engine core is dead (fault injected)", "restart the engine"
                    )
                if self.aborts != aborts:
                    return  # put to sleep with mode=abort: finished as "abort"
                step = self.steps.next(step, time.monotonic())
                if (delay := self.steps.at(step) - time.monotonic()) > 0:
                    await asyncio.sleep(delay)
                now = time.monotonic()
                if index == 0:  # the step that ends the prefill samples the first token
                    m.add("prompt_tokens", prompt_tokens)
                    m.observe("iteration_tokens_total", prompt_tokens + 1)
                    m.observe("time_to_first_token_seconds", now - arrived)
                else:
                    m.observe("iteration_tokens_total", 1)
                    m.observe("inter_token_latency_seconds", now - last)
                m.add("generation_tokens", 1)
                last = now
                emitted += 1
                held += self._hold_kv(1)
                yield self.sleep.answer(piece)
            reason = "length" if job.truncated else "stop"
        finally:
            end = time.monotonic()
            self._hold_kv(-held)
            await self._release()
            m.finished[reason if reason in m.finished else "abort"] += 1
            m.observe("e2e_request_latency_seconds", end - arrived)
            m.observe("request_queue_time_seconds", queue_time)
            m.observe("request_prompt_tokens", prompt_tokens)
            m.observe("request_generation_tokens", emitted)
            if emitted:
                m.observe("request_prefill_time_seconds", decode_start - prefill_start)
                m.observe("request_decode_time_seconds", end - decode_start)
            self._account_spec(emitted)

    def _hold_kv(self, tokens: int) -> int:
        """Take (or give back, negative) KV-cache room for `tokens`; returns `tokens`."""
        self.kv_tokens += tokens
        self.metrics.kv_usage = min(max(self.kv_tokens, 0) / self.settings.kv_capacity, 1.0)
        return tokens

    def _account_spec(self, emitted: int) -> None:
        k = self.settings.num_spec_tokens
        if not k or not emitted:
            return
        accepted = max(k * 3 // 5, 1)  # a steady 60 % acceptance
        drafts = max(emitted // (accepted + 1), 1)
        m = self.metrics
        m.add("spec_decode_num_drafts", drafts)
        m.add("spec_decode_num_draft_tokens", drafts * k)
        m.add("spec_decode_num_accepted_tokens", drafts * accepted)
        for pos in range(accepted):
            m.accepted_per_pos[pos] += drafts
