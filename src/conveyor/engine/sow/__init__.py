"""The State of the World: SOW topics, views, their queries and subscriptions
(reference G; docs/sow-and-views.md). The engine holds one
:class:`~conveyor.engine.sow.state.StateOfTheWorld` (``state.py``, the rules), an
orchestrator of the parts below; one name per module, the plural for the part, the
singular for one of what it holds:

- ``followers.py``: who follows each SOW topic and view, how a change reaches them;
- ``topics.py``: the SOW topics (publish, ``sow_delete``, expiry, recovery,
  replication); ``topic.py``: one topic's records and keys;
- ``views.py``: the view graph (building, feeding, rendering, outputs to queues);
  ``view.py``: one view, and a queue watch;
- ``queries.py``: queries and aggregated queries; ``production.py``: selection
  (``orderby``, ``top_n``, ``skip_n``) and results produced as their connection
  drains them (a queue's ``sow`` too);
- ``subscriptions.py``: record, delta and aggregated subscriptions;
- ``focus.py`` (what one subscription gets for one change), ``delta.py`` (merge and
  changed fields), ``aggregation.py`` (groups and accumulators), ``joins.py`` (views
  over joins).

This file imports nothing, so importing one of these modules (a queue's ``sow`` uses
``production.py``) loads only what that module needs.
"""
