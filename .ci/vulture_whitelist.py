"""What vulture (the dead-code check in scripts/test) cannot see used, each with why it stays.

    vulture laned .ci/vulture_whitelist.py --min-confidence 60 \
        --ignore-decorators "@access,@*.exception_handler,@field_validator,@model_validator"

The decorators ignored there: every API endpoint declares its access (@access, the guard's
rule) and FastAPI calls it; exception handlers and pydantic validators are called by their
frameworks. Anything else vulture reports is dead code: remove it, or add it here with a reason.
"""

# ruff: noqa
# mypy: ignore-errors

import laned
from laned.adapters import pagecache, state, upstream
from laned.api import limits
from laned.config import model
from laned.core import unit_state
from laned.daemon import ApiServer
from laned.engines import vllm_preload
from laned.gates import acceptance
from laned.sim import weightwire
from laned.render import wrapper

laned.__getattr__  # the package's lazy public surface (PEP 562), called by Python
pagecache.evict  # drops weights from the page cache: bench/prefetch.py and tests/integration/test_prefetch.py
state.StateWriter.writes  # the writes a burst gathered into one: bench/state_writes.py prints it
upstream._Connection.data_received  # asyncio.Protocol's callback, called by the event loop
limits.bounded.data_received  # the protocol bounded() builds: asyncio.Protocol's callback
limits.bounded.disconnected  # set on uvicorn's request cycle, which uvicorn reads
model.Sampling.temperature  # generation_config.json keys: validated fields, written by as_json_dict
model.Sampling.top_p  # (same)
model.Sampling.top_k  # (same)
model.Sampling.min_p  # (same)
model.Sampling.repetition_penalty  # (same)
model.Sampling.max_new_tokens  # (same)
unit_state.CLD_EXITED  # waitid(2)'s codes, named whole beside CLD_KILLED and CLD_DUMPED (used)
unit_state.Result.EXIT_CODE  # systemd's Result= vocabulary, named whole (systemd.exec(5))
unit_state.Result.CORE_DUMP  # (same)
unit_state.Result.WATCHDOG  # (same)
unit_state.Result.START_LIMIT_HIT  # (same)
unit_state.Result.RESOURCES  # (same)
unit_state.Result.OOM_KILL  # (same)
ApiServer.capture_signals  # uvicorn.Server's method, overridden: uvicorn calls it
ApiServer.main_loop  # uvicorn.Server's method, overridden: uvicorn calls it
acceptance.Gates.speed  # a gate: run by name (getattr(runner, gate)) like every other gate
wrapper.engine_argv  # the wrapper's argv as data: the tests hold the rendered wrapper to it
vllm_preload._PlainOnly.find_class  # pickle.Unpickler's hook, overridden: the unpickler calls it
weightwire._Plain.find_class  # (same, the simulator's copy)
