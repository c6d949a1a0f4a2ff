"""Reading jobs by id (see :class:`tether.store.common.base.SqlBase`)."""

from tether.store.rows import JOB_COLUMNS
from tether.store.sql.sqlite.fragments import each

JOBS_BY_IDS = f"SELECT {JOB_COLUMNS} FROM tether_jobs WHERE id IN {each('ids')}"
