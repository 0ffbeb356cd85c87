"""laned's read of an engine's /metrics: only the samples it needs go to the parser, and the
result is the same as a parse of the whole page (several engines, histograms and all)."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from laned.adapters.probes import parse_engine_metrics
from laned.engines.vllm import KV_USAGE, SUMMED
from laned.sim.metrics import Metrics


def page(engines: int) -> str:
    """A data-parallel vLLM's page: each engine's families, labelled engine="N"."""
    parts = []
    for n in range(engines):
        m = Metrics(model_name="m", spec_decode=True, num_spec_tokens=3)
        m.running, m.waiting, m.kv_usage = n + 1, 2 * n, 0.1 * (n + 1)
        m.add("generation_tokens", 100 * (n + 1))
        m.add("prompt_tokens", 7)
        for value in (1, 64, 900):
            m.observe("iteration_tokens_total", value)
        text = m.render().replace('engine="0"', f'engine="{n}"')
        parts.append(
            text if n == 0 else "\n".join(x for x in text.splitlines() if not x.startswith("#"))
        )
    return "\n".join(parts) + "\n"


def whole_page_parse(text: str) -> dict[str, float]:
    """The reference: every family parsed, the same sums and maximum taken."""
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in SUMMED:
                values[SUMMED[sample.name]] = values.get(SUMMED[sample.name], 0.0) + sample.value
            elif sample.name in KV_USAGE:
                key = KV_USAGE[sample.name]
                values[key] = max(values.get(key, 0.0), sample.value)
    return values


def test_the_filtered_parse_equals_a_whole_page_parse() -> None:
    text = page(4)
    sample, reference = parse_engine_metrics(text), whole_page_parse(text)
    assert sample.running == reference["running"] == 1 + 2 + 3 + 4
    assert sample.waiting == reference["waiting"] == 0 + 2 + 4 + 6
    assert sample.generation_tokens == reference["generation_tokens"] == 1000
    assert sample.prompt_tokens == reference["prompt_tokens"] == 28
    assert sample.steps == reference["steps"] == 12
    assert abs(sample.kv_cache_usage - 0.4) < 1e-9 and reference["kv"] == sample.kv_cache_usage
