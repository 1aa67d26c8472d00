"""The search wing: ``POST /v1/search`` from admission to the answer, in one place.

- :mod:`.pipeline`: :class:`~.pipeline.SearchPipeline`, the wing's parts in one typed object
  (``app.state.search``), and the route's one dependency;
- :mod:`.admission`: the early 429 before the body is read (latency objective, in-flight limit,
  the event loop's lag) and the :class:`~.admission.Arrival` each admitted search carries;
- :mod:`.codec`: the request's JSON parsed and validated by pydantic-core, the answer rendered by it;
- :mod:`.route`: the route itself (limits, weights, filters, exposure records);
- :mod:`.batching`: the micro-batcher (gathering, fair slices, time-bounded queue, shedding);
- :mod:`.results`: request vectors checked against the layout, and the hits of the response.

docs/architecture.md section 3 walks one request through it.
"""
