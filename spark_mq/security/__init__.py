"""Security: who a client is (users, tokens, certificates), what it may do (the access rules),
the record of it (the audit log), and TLS. Plugged into the session layer: an
:class:`~spark_mq.security.authenticate.Authenticator` turns credentials into a
:class:`~spark_mq.session.Principal`, and :class:`~spark_mq.security.acl.AccessRules` is the
session's guard."""
