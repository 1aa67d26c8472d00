"""OpenTelemetry spans of a search, through the OpenTelemetry SDK and an OTLP/HTTP exporter.

Switched by settings (``ESP_TRACING``, ``ESP_OTLP_ENDPOINT``, ``ESP_TRACE_SAMPLE_RATIO``; the
chart's ``tracing.*`` values set them). The spans come from the one request path of
``POST /v1/search``, no second one::

    esp.search                  the whole request (child of the caller's ``traceparent``, or of
      esp.search.parse          an active server span); parsing and validating the JSON body
      esp.search.queue_wait     from queued on the micro-batcher to its batch starting
      esp.search.encode         the batch's query texts through the encoder (texts only)
      esp.search.engine         the batch's exact top-k scan (attribute: backend, batch size)
      esp.search.serialise      rendering the response body

Queue wait, encode and engine happen on the batcher's worker thread for a whole micro-batch;
the batch records their wall-clock times for each request in it
(:meth:`service.search.batching.MicroBatcher.submit`'s ``stages``) and the request turns them into
child spans with those times once it is answered, so a span tree reads like the request it
describes. Disabled (the default), :data:`DISABLED` costs an attribute check per stage.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

from esp_retrieval.service.config import Settings

SERVICE_NAME = "esp-retrieval"
TRACER_NAME = "esp.search"

#: One stage measured by the micro-batcher: (name, start ns, end ns, attributes), wall clock.
Stage = tuple[str, int, int, dict[str, Any]]


class Tracing:
    """``app.state.tracing``: a tracer when enabled; every method is a no-op when not."""

    def __init__(self, provider: Any | None = None) -> None:
        self.provider = provider
        self.tracer = provider.get_tracer(TRACER_NAME) if provider is not None else None

    @property
    def enabled(self) -> bool:
        return self.tracer is not None

    @classmethod
    def from_settings(cls, settings: Settings, exporter: Any | None = None) -> Tracing:
        """Disabled unless ``settings.tracing``; ``exporter`` replaces the OTLP one (tests)."""
        if not settings.tracing:
            return DISABLED
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
        from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

        provider = TracerProvider(
            resource=Resource.create({"service.name": SERVICE_NAME}),
            sampler=ParentBased(TraceIdRatioBased(settings.trace_sample_ratio)),
        )
        if exporter is None:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            endpoint = settings.otlp_endpoint
            otlp = OTLPSpanExporter(endpoint=endpoint) if endpoint else OTLPSpanExporter()
            provider.add_span_processor(BatchSpanProcessor(otlp))
        else:
            provider.add_span_processor(SimpleSpanProcessor(exporter))
        return cls(provider)

    @contextlib.contextmanager
    def request_span(self, name: str, headers: Mapping[str, str] | None = None) -> Iterator[Any]:
        """The request's span: a child of the active span, else of the caller's ``traceparent``."""
        if self.tracer is None:
            yield None
            return
        from opentelemetry import trace
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        context = None
        if not trace.get_current_span().get_span_context().is_valid and headers is not None:
            context = TraceContextTextMapPropagator().extract(dict(headers))
        with self.tracer.start_as_current_span(name, context=context, kind=trace.SpanKind.SERVER) as span:
            yield span

    @contextlib.contextmanager
    def span(self, name: str, **attributes: Any) -> Iterator[Any]:
        """A child span of the current one (no-op when disabled)."""
        if self.tracer is None:
            yield None
            return
        with self.tracer.start_as_current_span(name, attributes=attributes) as span:
            yield span

    def stages(self) -> list[Stage] | None:
        """A list for the batcher to record this request's stages in (None when disabled)."""
        return [] if self.tracer is not None else None

    def record_stages(self, stages: list[Stage] | None) -> None:
        """Child spans of the current span with the times the batcher measured."""
        if self.tracer is None or not stages:
            return
        for name, start, end, attributes in stages:
            span = self.tracer.start_span(name, start_time=start, attributes=attributes)
            span.end(end_time=end)

    def flush(self) -> None:
        """Export the spans still buffered (at shutdown)."""
        if self.provider is not None:
            self.provider.force_flush()


DISABLED = Tracing()
