-- The index's schema (core/index.py), as the steps that made it: `-- version N: ...` takes a
-- database whose `PRAGMA user_version` is N-1 to N. A new database runs every step, an old one the
-- steps it lacks, all in one transaction with the version bump (Index._migrate), so a file is at one
-- version or the next, never between. A released step is never edited: a change is a new step at the
-- end (and a fixture of the old schema in tests/support/old_indexes/). Plain SQL, statement by
-- statement; every name is quoted as the first steps' statements (made by sqlite-utils) quoted it,
-- so a new database and a migrated one hold the same schema text (tests/core/test_index.py compares them).

-- version 1: store paths, the build log, publication and tool memos
CREATE TABLE "paths" (
   "name" TEXT PRIMARY KEY,
   "key" TEXT,
   "engine" TEXT,
   "version" TEXT,
   "variant" TEXT,
   "as_of" TEXT,
   "uv_version" TEXT,
   "python" TEXT,
   "inputs" TEXT,
   "content_hash" TEXT,
   "size" INTEGER,
   "files" INTEGER,
   "build_seconds" REAL,
   "created" TEXT,
   "last_used" TEXT
);
CREATE UNIQUE INDEX "idx_paths_key"
    ON "paths" ("key");
CREATE TABLE "builds" (
   "id" INTEGER PRIMARY KEY,
   "key" TEXT,
   "name" TEXT,
   "pid" INTEGER,
   "host" TEXT,
   "started" TEXT,
   "finished" TEXT,
   "outcome" TEXT,
   "seconds" REAL,
   "error" TEXT
);
CREATE INDEX "idx_builds_key"
    ON "builds" ("key");
CREATE TABLE "releases" (
   "index_url" TEXT,
   "project" TEXT,
   "version" TEXT,
   "published" TEXT,
   PRIMARY KEY ("index_url", "project", "version")
);
CREATE TABLE "latest" (
   "index_url" TEXT,
   "project" TEXT,
   "version" TEXT,
   "fetched" REAL,
   PRIMARY KEY ("index_url", "project")
);
CREATE TABLE "tools" (
   "kind" TEXT,
   "ident" TEXT,
   "stamp" TEXT,
   "info" TEXT,
   PRIMARY KEY ("kind", "ident")
);

-- version 2: profiles' generations and switches, pins
CREATE TABLE "generations" (
   "profile" TEXT,
   "number" INTEGER,
   "name" TEXT,
   "created" TEXT,
   "created_by" TEXT,
   "deleted" TEXT,
   PRIMARY KEY ("profile", "number")
);
CREATE TABLE "switches" (
   "id" INTEGER PRIMARY KEY,
   "profile" TEXT,
   "from_number" INTEGER,
   "to_number" INTEGER,
   "at" TEXT,
   "by" TEXT,
   "kind" TEXT
);
CREATE TABLE "pins" (
   "name" TEXT PRIMARY KEY,
   "path_name" TEXT,
   "created" TEXT
);

-- version 3: references between store paths, recorded at registration (Nix's Refs); paths
-- registered before this step get theirs read from their trees (Index._backfill_references)
CREATE TABLE "refs" (
   "referrer" TEXT,
   "reference" TEXT,
   PRIMARY KEY ("referrer", "reference")
);
CREATE INDEX "idx_refs_reference"
    ON "refs" ("reference");

-- version 4: gc's records: the cache entries each path was built from (kept past the path, for
-- repair and cold rollback), and when gc last saw each path rooted (the grace period)
CREATE TABLE "cache_uses" (
   "path_name" TEXT,
   "cache" TEXT,
   "entry" TEXT,
   "used_at" TEXT,
   PRIMARY KEY ("path_name", "cache", "entry")
);
CREATE INDEX "idx_cache_uses_cache_entry"
    ON "cache_uses" ("cache", "entry");
CREATE TABLE "gc_rooted" (
   "name" TEXT PRIMARY KEY,
   "last_rooted" TEXT
);

-- version 5: references become foreign keys, as Nix's Refs: a path's references go with it
-- (CASCADE), and a path another registered path references cannot be forgotten (RESTRICT), so the
-- index never holds a referrer without its closure. References an older index held to paths it
-- does not hold are dropped. The switches table goes: nothing ever read it (each profile's history
-- file, roots/records.py, keeps who switched when).
CREATE TABLE "refs_v5" (
   "referrer" TEXT NOT NULL REFERENCES "paths" ("name") ON DELETE CASCADE,
   "reference" TEXT NOT NULL REFERENCES "paths" ("name") ON DELETE RESTRICT,
   PRIMARY KEY ("referrer", "reference")
);
INSERT INTO "refs_v5" ("referrer", "reference")
    SELECT "referrer", "reference" FROM "refs"
    WHERE "referrer" IN (SELECT "name" FROM "paths") AND "reference" IN (SELECT "name" FROM "paths")
      AND "referrer" != "reference";
DROP TABLE "refs";
ALTER TABLE "refs_v5" RENAME TO "refs";
CREATE INDEX "idx_refs_reference"
    ON "refs" ("reference");
DROP TABLE "switches";

-- version 6: inode stamps (core/stamps.py): a store inode whose bytes a pull hashed to its digest,
-- with its size, mtime and ctime then; a later pull links it unread while all four still match.
CREATE TABLE "inode_stamps" (
   "dev" INTEGER NOT NULL,
   "ino" INTEGER NOT NULL,
   "digest" TEXT NOT NULL,
   "size" INTEGER NOT NULL,
   "mtime_ns" INTEGER NOT NULL,
   "ctime_ns" INTEGER NOT NULL,
   PRIMARY KEY ("dev", "ino")
);
CREATE INDEX "idx_inode_stamps_digest"
    ON "inode_stamps" ("digest");
