/* The unique id between the processes of a multi-process C test (recover.c, mismatch.c): the
 * includer defines `dir` (the folder the ranks share), `rank`, and FAIL and CHECK (its own
 * verdict lines) before including this. */
/* The `creator` writes the id of generation `gen` to DIR/id.GEN; the others wait for it (60 s
 * at most). */
static ncclUniqueId share_id(int gen, int creator) {
  char path[512], tmp[520];
  snprintf(path, sizeof path, "%s/id.%d", dir, gen);
  ncclUniqueId id;
  if (creator) {
    CHECK(ncclGetUniqueId(&id) == ncclSuccess);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE* f = fopen(tmp, "wb");
    CHECK(f && fwrite(&id, sizeof id, 1, f) == 1 && fclose(f) == 0);
    CHECK(rename(tmp, path) == 0);
    return id;
  }
  for (int i = 0; i < 6000; i++) {
    FILE* f = fopen(path, "rb");
    if (f) {
      size_t got = fread(&id, sizeof id, 1, f);
      fclose(f);
      if (got == 1) return id;
    }
    usleep(10000);
  }
  FAIL("no id %s after 60 s", path);
}
