"""Prometheus text for /metrics (docs/HTTP.md §1): request counters, timings, engine totals."""

from __future__ import annotations

from collections import Counter

import attrs

from waste.domain.ports import EngineStats


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


@attrs.define
class Metrics:
    requests: Counter = attrs.field(factory=Counter)  # (route, status) -> count
    prompt_tokens: int = 0
    generated_tokens: int = 0
    queue_s: float = 0.0
    prefill_s: float = 0.0
    decode_s: float = 0.0
    completions: int = 0

    def count_request(self, route: str, status: int) -> None:
        self.requests[(route, status)] += 1

    def render(self, *, cancelled: int, queue_depth: int, running: int,
               stats: EngineStats | None, info: dict[str, str]) -> str:
        lines = ["# TYPE waste_requests_total counter"]
        for (route, status), n in sorted(self.requests.items()):
            lines.append(f'waste_requests_total{{route="{_label(route)}",status="{status}"}} {n}')
        lines += [
            "# TYPE waste_requests_cancelled_total counter",
            f"waste_requests_cancelled_total {cancelled}",
            "# TYPE waste_prompt_tokens_total counter",
            f"waste_prompt_tokens_total {self.prompt_tokens}",
            "# TYPE waste_generated_tokens_total counter",
            f"waste_generated_tokens_total {self.generated_tokens}",
            "# TYPE waste_queue_seconds_total counter", f"waste_queue_seconds_total {self.queue_s:.6f}",
            "# TYPE waste_prefill_seconds_total counter", f"waste_prefill_seconds_total {self.prefill_s:.6f}",
            "# TYPE waste_decode_seconds_total counter", f"waste_decode_seconds_total {self.decode_s:.6f}",
            "# TYPE waste_queue_depth gauge", f"waste_queue_depth {queue_depth}",
            "# TYPE waste_requests_running gauge", f"waste_requests_running {running}",
        ]
        if stats is not None:
            lines += [
                "# TYPE waste_expert_hits_total counter", f"waste_expert_hits_total {stats.experts_hit}",
                "# TYPE waste_expert_misses_total counter", f"waste_expert_misses_total {stats.experts_missed}",
                "# TYPE waste_expert_bytes_read_total counter",
                f"waste_expert_bytes_read_total {stats.bytes_read}",
                "# TYPE waste_direct_io gauge", f"waste_direct_io {int(stats.direct_io)}",
                "# TYPE waste_memory_budget_bytes gauge", f"waste_memory_budget_bytes {stats.budget_bytes}",
                "# TYPE waste_memory_peak_bytes gauge", f"waste_memory_peak_bytes {stats.peak_bytes}",
            ]
        labels = ",".join(f'{k}="{_label(v)}"' for k, v in info.items())
        lines += ["# TYPE waste_info gauge", f"waste_info{{{labels}}} 1"]
        return "\n".join(lines) + "\n"
