"""One message queue (spec 000) and its parts: :mod:`.queue` (``Queue``, the
orchestrator), the message state machine (:mod:`.state`), the parts it moves messages
between (:mod:`.order`, :mod:`.store`, :mod:`.priority`, :mod:`.leases`, :mod:`.seats`,
:mod:`.window`, :mod:`.expiry`, :mod:`.replica`), its replay (:mod:`.recovery`), its
events and their records (:mod:`.events`, :mod:`.journal`), FileBackedMetadata
(:mod:`.paging`, :mod:`.snapshot`), and the engine's bindings of queues to topics
(:mod:`.bindings`). Imports name the module; this package exports nothing itself.
"""
