"""Stream ids and projection keys of any length a valid command can name.

`operation/<tenant>/<idempotency key>` reaches 366 characters and a rollout's measurement key
301 from ids the commands accept; PostgreSQL refused them in its 300-character columns, failing
the whole batch's write on every retry. TEXT on PostgreSQL (from VARCHAR, without rewriting the
table or its indexes); SQLite never enforced the length.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

COLUMNS = (("events", "stream_id"), ("projections", "key"))


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for table, column in COLUMNS:
        op.alter_column(table, column, type_=sa.Text(), existing_type=sa.String(300),
                        existing_nullable=False)


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for table, column in COLUMNS:
        op.alter_column(table, column, type_=sa.String(300), existing_type=sa.Text(),
                        existing_nullable=False)
