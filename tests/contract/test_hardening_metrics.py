"""/metrics counts what happened (issue 11, fault 7) and speaks the names dashboards read.

A blocking request whose client leaves is counted (status 499, the client closed it); tokens
of cancelled generations reach the token counters; a stream cut short is not a 200. The
series come from prometheus_client, with HELP lines and vLLM's latency histograms.
"""

from __future__ import annotations

import time

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.contract.engines import serve
from tests.contract.test_http_concurrency import LONG, chat, open_request

CHAT = "/v1/chat/completions"


def samples(base: str) -> dict[tuple[str, tuple], float]:
    text = httpx.get(base + "/metrics", timeout=10).text
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def requests_total(base: str, status: str) -> float:
    return samples(base).get(("waste_requests_total", (("route", CHAT), ("status", status))), 0.0)


def eventually(check) -> bool:
    """The count lands when the exchange ends, just after the service sees the client leave;
    a bounded wait for it (a safety net: the old code never counted it)."""
    for _ in range(200):
        if check():
            return True
        time.sleep(0.05)
    return False


def test_a_blocking_request_whose_client_leaves_is_counted(request):
    with serve("fake", request, script=LONG) as served:
        served.engine.pause_at(3)
        sock = open_request(served.base, chat("long wait", max_tokens=50))
        assert served.engine.paused.wait(20)
        sock.close()
        served.wait_for(lambda s: s.requests_cancelled == 1)
        served.engine.resume()
        served.wait_for(lambda s: s.running is None)
        assert eventually(lambda: requests_total(served.base, "499") == 1)
        assert requests_total(served.base, "200") == 0
        # the three tokens delivered before the client left are counted
        values = samples(served.base)
        assert values[("waste_generated_tokens_total", ())] >= 3
        generation = [v for (name, _), v in values.items() if name == "vllm:generation_tokens_total"]
        assert generation and generation[0] >= 3


def test_a_cut_stream_is_not_a_200(request):
    with serve("fake", request, script=LONG, thinking=False) as served:
        served.engine.pause_at(3)
        with httpx.Client(base_url=served.base, timeout=30) as c:
            with c.stream("POST", CHAT, json=chat("long go", stream=True, max_tokens=400)) as r:
                assert r.status_code == 200
                lines = r.iter_lines()
                assert next(lines).startswith("data: ")
                assert served.engine.paused.wait(20)
        served.wait_for(lambda s: s.requests_cancelled == 1)
        served.engine.resume()
        served.wait_for(lambda s: s.running is None)
        assert eventually(lambda: requests_total(served.base, "499") == 1)
        assert requests_total(served.base, "200") == 0
        assert samples(served.base)[("waste_generated_tokens_total", ())] >= 3


def test_histograms_and_help_lines(request):
    with serve("fake", request, script=LONG) as served:
        with httpx.Client(base_url=served.base, timeout=30) as c:
            assert c.post(CHAT, json=chat("long one", max_tokens=5)).status_code == 200
            with c.stream("POST", CHAT, json=chat("long two", max_tokens=5, stream=True)) as r:
                r.read()
        text = httpx.get(served.base + "/metrics").text
        families = {f.name: f for f in text_string_to_metric_families(text)}
        for name in ("vllm:time_to_first_token_seconds", "vllm:time_per_output_token_seconds",
                     "vllm:e2e_request_latency_seconds", "vllm:request_queue_time_seconds",
                     "vllm:request_prefill_time_seconds", "vllm:request_decode_time_seconds"):
            family = families[name]
            assert family.type == "histogram" and family.documentation, name
            count = next(s.value for s in family.samples if s.name == name + "_count")
            assert count == 2, (name, count)
        for name in ("waste_requests", "waste_generated_tokens", "waste_expert_hits",
                     "waste_queue_depth", "vllm:num_requests_running", "vllm:prompt_tokens"):
            assert families[name].documentation, name
        assert "# HELP waste_requests_total " in text
        value = samples(served.base)
        assert value[("waste_requests_total", (("route", CHAT), ("status", "200")))] == 2
