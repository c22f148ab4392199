#pragma once
// Text classification read from files: Debian's manual pages labelled by section (text_task, task "text"), Debian's
// fortunes labelled by topic (fortunes_task, task "fortunes") and the user's own TSV / CSV file (file_task, task
// "file:PATH"). All declared in data/tasks.h; docs/data.md has the counts.
//
//   asc::data::Task t = asc::data::make_task("text", {.max_len = 2048});
//   asc::data::Example ex = t.train->get(0);     // ex.input (T) int64 bytes 0..255, T <= 2048; ex.label in [0, 4)
//   asc::data::Task u = asc::data::make_task("file:reviews/train.tsv");   // + reviews/val.tsv, reviews/test.tsv
//
// text_task — the pages of the Debian packages `manpages` and `manpages-dev` only (the files dpkg lists for them,
// English pages /usr/share/man/manN/*; other packages' pages never enter), so the dataset is the same on every
// machine with those packages. Symlinked duplicates and `.so` redirect stubs are skipped. Classes (by section):
//   0 "2: system calls"   1 "3: library functions"   2 "4+5: special files and file formats"
//   3 "7: overviews, conventions and miscellany"     (sections 1, 6 and 8 — 20 pages — are dropped: too few)
// Input: the page's roff source, gunzipped, as int64 byte tokens 0..255, without its comment lines (`.\"`, `'\"`:
// copyright headers) and without its `.TH` title line (it names the section: the label would be read off it), cut to
// max_len (default 4096); pages shorter than min_len (default 0) are skipped. Split by a hash of the file name
// (FNV-1a 64 of e.g. "man2/access.2.gz"; % 10 == 0: test, == 1: val, else train — about 80/10/10), so that no
// page's split depends on which other pages exist; each split in file-name order. options.data_dir is refused.
//
// fortunes_task — short texts of the Debian package `fortunes` (version kFortunesVersion exactly: another version
// holds other texts, so the task refuses it), labelled by the file they come from, /usr/share/games/fortunes/NAME:
//   0 "computers"   1 "definitions"   2 "people"   3 "politics"   (the four largest topics but the generic "cookie")
// Each file's texts are the blocks between lines "%"; empty blocks are dropped, and a text found in two topics
// (identical bytes) is dropped from both, its label being ambiguous (a repeat within one topic is kept once). Input:
// the text's bytes, cut to max_len (default 256), texts shorter than min_len skipped. Split per topic by a hash of
// the text (FNV-1a 64; ties by the text): in hash order the first quarter of each topic is test, the next 5 % val,
// the rest train (about 1050 / 210 / 2940 texts) — stratified, and no text's split depends on the others'; each
// split in hash order, so a smaller --test-size takes a mixed sample. options.data_dir is refused.
//
// file_task — PATH is a table of `label<SEP>text` records, one per line (a gzip-compressed file is read too).
//   Separator: `.tsv` tab, `.csv` comma (a trailing `.gz` ignored), else the first line decides: tab if it holds
//     one, else comma. TSV: the text is the rest of the line (tabs included). CSV: the label and the text may be
//     quoted ("..." with "" for a quote; a quoted text may span lines); an unquoted text is the rest of the line.
//   Header: a first record `label<SEP>text` (text mode) or `label<SEP>ids` (token-id mode); no header: text mode.
//     Text mode: the text's bytes are the tokens (vocab 256). Token-id mode: the second field is
//     whitespace-separated non-negative integer ids (vocab = largest id + 1, at most kMaxFileVocab).
//   Labels: if every label is an integer, they are class ids (>= 0; classes = largest + 1, names "0", "1", ...);
//     otherwise every label is a class name, numbered in order of first appearance. A mix is an error.
//   Blank lines are skipped; a line without a separator, an empty label or text, a bad id, an unterminated quote is
//     an asc::Error naming file:line and what was expected.
//   Splits: if the file name contains "train", its last "train" replaced by "val" / "test" names sibling files
//     (train.tsv -> val.tsv, test.tsv; sst_train.csv -> sst_val.csv, sst_test.csv): each one present is that split.
//     A split without a sibling is cut from the file: a permutation drawn from options.seed takes 10 % (at least
//     one example) for each missing split, the rest is train (80/10/10 when both are missing); each split keeps
//     the file's order. max_len cuts sequences (0: no cut); sequences shorter than min_len are skipped;
//     options.data_dir is refused (the path is the one in file:PATH).
// pad_id is 0 for both tasks: the loader's valid mask marks the padding, so its value never matters.
#include <cstdint>
#include <string>
#include <vector>

#include "data/gzip.h"  // read_file_maybe_gzip

namespace asc::data {

// The largest vocabulary a token-id file may declare (its largest id + 1): a typo like 10000000000 is an error,
// not a giant embedding table.
inline constexpr int64_t kMaxFileVocab = int64_t{1} << 24;
// The largest class id a file may use (classes = largest id + 1).
inline constexpr int64_t kMaxFileClasses = 100000;

// The text task's class names, in label order (see above).
const std::vector<std::string>& man_page_class_names();

// The fortunes task's package version: the texts, and so every split, are those of this version.
inline constexpr const char* kFortunesVersion = "1:1.99.1-7.3";
// The fortunes task's topics (file names under /usr/share/games/fortunes/), in label order.
const std::vector<std::string>& fortune_topics();

}  // namespace asc::data
