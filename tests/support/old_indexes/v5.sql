-- An index at schema version 5 as llmgw-store made it (schema.sql's steps 1-5, migrated from
-- v4.sql), with rows in every table: tests/test_index.py migrates it. Frozen: never edit.
PRAGMA user_version=5;
BEGIN TRANSACTION;
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
INSERT INTO "builds" VALUES(1,'aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa','aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa-tinyengine-1.0-cpu',4242,'node1','2024-03-01T00:00:00Z','2024-03-01T00:00:01Z','built',1.0,NULL);
INSERT INTO "builds" VALUES(2,'cccccccccccccccccccccccccccccccc','cccccccccccccccccccccccccccccccc-tinyengine-0.9-cpu',4243,'node1','2024-03-01T00:00:00Z',NULL,'running',NULL,NULL);
CREATE TABLE "cache_uses" (
   "path_name" TEXT,
   "cache" TEXT,
   "entry" TEXT,
   "used_at" TEXT,
   PRIMARY KEY ("path_name", "cache", "entry")
);
INSERT INTO "cache_uses" VALUES('aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa-tinyengine-1.0-cpu','uv','wheels-v5/tinydep','2024-03-01T00:00:00Z');
INSERT INTO "cache_uses" VALUES('cccccccccccccccccccccccccccccccc-tinyengine-0.9-cpu','pyc','ab/cd','2024-03-01T00:00:00Z');
CREATE TABLE "gc_rooted" (
   "name" TEXT PRIMARY KEY,
   "last_rooted" TEXT
);
INSERT INTO "gc_rooted" VALUES('aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa-tinyengine-1.0-cpu','2024-03-04T00:00:00Z');
CREATE TABLE "generations" (
   "profile" TEXT,
   "number" INTEGER,
   "name" TEXT,
   "created" TEXT,
   "created_by" TEXT,
   "deleted" TEXT,
   PRIMARY KEY ("profile", "number")
);
INSERT INTO "generations" VALUES('p',1,'aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa-tinyengine-1.0-cpu','2024-03-01T00:00:00Z','root@node1 pid 1',NULL);
INSERT INTO "generations" VALUES('p',2,'cccccccccccccccccccccccccccccccc-tinyengine-0.9-cpu','2024-03-01T00:00:00Z','root@node1 pid 1','2024-03-05T00:00:00Z');
CREATE TABLE "latest" (
   "index_url" TEXT,
   "project" TEXT,
   "version" TEXT,
   "fetched" REAL,
   PRIMARY KEY ("index_url", "project")
);
INSERT INTO "latest" VALUES('https://pypi.org/simple','tinyengine','1.1',1709251200.0);
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
INSERT INTO "paths" VALUES('aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa-tinyengine-1.0-cpu','aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa','tinyengine','1.0','cpu','2024-02-02T00:00:00Z','0.13.9','3.11.7','{"as_of": "2024-02-02T00:00:00Z"}','blake3:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa',1000,10,1.5,'2024-03-01T00:00:00.000000Z','2024-03-02T00:00:00.000000Z');
INSERT INTO "paths" VALUES('bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb-tinyengine-1.1-cpu','bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb','tinyengine','1.1','cpu','2024-02-02T00:00:00Z','0.13.9','3.11.7','{"as_of": "2024-02-02T00:00:00Z"}','blake3:bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb',1000,10,1.5,'2024-03-01T00:00:00.000000Z','2024-03-02T00:00:00.000000Z');
CREATE TABLE "pins" (
   "name" TEXT PRIMARY KEY,
   "path_name" TEXT,
   "created" TEXT
);
INSERT INTO "pins" VALUES('good','aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa-tinyengine-1.0-cpu','2024-03-01T00:00:00Z');
CREATE TABLE "refs" (
   "referrer" TEXT NOT NULL REFERENCES "paths" ("name") ON DELETE CASCADE,
   "reference" TEXT NOT NULL REFERENCES "paths" ("name") ON DELETE RESTRICT,
   PRIMARY KEY ("referrer", "reference")
);
INSERT INTO "refs" VALUES('bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb-tinyengine-1.1-cpu','aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa-tinyengine-1.0-cpu');
CREATE TABLE "releases" (
   "index_url" TEXT,
   "project" TEXT,
   "version" TEXT,
   "published" TEXT,
   PRIMARY KEY ("index_url", "project", "version")
);
INSERT INTO "releases" VALUES('https://pypi.org/simple','tinyengine','1.0','2024-02-01T00:00:00Z');
CREATE TABLE "tools" (
   "kind" TEXT,
   "ident" TEXT,
   "stamp" TEXT,
   "info" TEXT,
   PRIMARY KEY ("kind", "ident")
);
INSERT INTO "tools" VALUES('uv','/usr/bin/uv','1:2:3','{"stamp": "1:2:3", "version": "0.13.9"}');
CREATE UNIQUE INDEX "idx_paths_key"
    ON "paths" ("key");
CREATE INDEX "idx_builds_key"
    ON "builds" ("key");
CREATE INDEX "idx_cache_uses_cache_entry"
    ON "cache_uses" ("cache", "entry");
CREATE INDEX "idx_refs_reference"
    ON "refs" ("reference");
COMMIT;
