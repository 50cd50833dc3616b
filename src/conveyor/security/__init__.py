"""The security shell: credentials, users files, TLS contexts, logon rate limits.

Decisions about what an authenticated user may do live in the engine
(:mod:`conveyor.engine.entitlements`); this package answers "who is this?" and does the
work that needs files, threads or sockets: reading the users file
(:mod:`.users`), verifying argon2 hashes off the event loop (:mod:`.authenticator`),
counting wrong credentials per address and user (:mod:`.ratelimit`), building and reloading ``ssl``
contexts (:mod:`.tls`). See docs/security.md.
"""
