/*
 * model_file.h — where the tests find the real model file (SmolLM2-135M-Instruct,
 * fetched by scripts/get-model.sh) for the GGUF reader, tokenizer and model tests.
 */
#ifndef PKV_TEST_MODEL_FILE_H
#define PKV_TEST_MODEL_FILE_H

/* $PKV_MODEL, else where scripts/get-model.sh puts it ($PKV_MODEL_CACHE, else
 * ~/.cache/pagedkv/models); skips the calling test when the file is absent. */
const char *pt_model_path(void);

#endif
