#!/usr/bin/env bash
# Checks the relative links of the READMEs and the book (docs/src): every [text](target) whose
# target is not a URL must name a file that exists, relative to the page that links it, and a
# #fragment must name a heading of that page (slugs as mdBook and GitHub make them: lower case,
# spaces to '-', other punctuation dropped). Links inside code blocks and code spans do not
# count. Exits 1 and lists the broken links when there are any.
#
#   deploy/linkcheck.sh [FILE.md...]
#
# Default: README.md, deploy/README.md, deploy/vm/README.md and docs/src/**/*.md.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ $# -gt 0 ]; then
  files=("$@")
else
  files=(README.md deploy/README.md deploy/vm/README.md)
  while IFS= read -r f; do files+=("$f"); done < <(find docs/src -name '*.md' | sort)
fi

# "line<TAB>target" for every inline link outside code.
links_of() {
  awk '
    /^[ \t]*(```|~~~)/ { fence = !fence; next }
    fence { next }
    {
      line = $0
      gsub(/`[^`]*`/, "", line)
      while (match(line, /\]\([^)]*\)/)) {
        target = substr(line, RSTART + 2, RLENGTH - 3)
        sub(/[ \t].*$/, "", target)          # drop a "title"
        print NR "\t" target
        line = substr(line, RSTART + RLENGTH)
      }
    }' "$1"
}

# The anchors of a page's headings, one a line.
anchors_of() {
  awk '
    /^[ \t]*(```|~~~)/ { fence = !fence; next }
    fence { next }
    /^#+[ \t]/ {
      h = $0
      sub(/^#+[ \t]+/, "", h); sub(/[ \t]+#*[ \t]*$/, "", h)
      gsub(/`/, "", h)
      gsub(/\[|\]\([^)]*\)/, "", h)          # a link in a heading keeps its text
      h = tolower(h)
      gsub(/[^a-z0-9 _-]/, "", h)
      gsub(/ /, "-", h)
      n = seen[h]++
      print (n ? h "-" n : h)
    }' "$1"
}

bad=0
checked=0
for f in "${files[@]}"; do
  dir=$(dirname "$f")
  while IFS=$'\t' read -r line target; do
    case "$target" in
      ''|http://*|https://*|mailto:*) continue ;;
    esac
    checked=$((checked + 1))
    path=${target%%#*}
    frag=""
    [ "$path" != "$target" ] && frag=${target#*#}
    if [ -z "$path" ]; then
      dest=$f
    else
      dest=$dir/$path
    fi
    if [ ! -e "$dest" ]; then
      echo "$f:$line: broken link: $target (no $dest)"
      bad=$((bad + 1))
      continue
    fi
    if [ -n "$frag" ] && [ -f "$dest" ] && [[ "$dest" == *.md ]]; then
      if ! anchors_of "$dest" | grep -qxF -- "$frag"; then
        echo "$f:$line: broken anchor: $target (no heading '#$frag' in $dest)"
        bad=$((bad + 1))
      fi
    fi
  done < <(links_of "$f")
done

echo "linkcheck: ${#files[@]} files, $checked relative links, $bad broken"
[ "$bad" -eq 0 ]
