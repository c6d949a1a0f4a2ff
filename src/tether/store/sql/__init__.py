"""The SQL text of each dialect, one module per concern under the same names.

``sql.sqlite.auth.CREATE_TOKEN`` and ``sql.postgres.auth.CREATE_TOKEN`` do the same
thing; :mod:`tether.store.common` calls them by name. Parameters are named: ``:name`` on
SQLite, ``%(name)s`` on PostgreSQL.
"""
