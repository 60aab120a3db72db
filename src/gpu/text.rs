//! [`Text`]: a kernel's WGSL or its variant's label, either compiled into the binary
//! or generated for a variant at run time (an unrolled tensor-core kernel, a variant's
//! constants, its label).
//!
//! Generated text is shared (`Arc<str>`) by every copy of its kernel and by the
//! pipeline cache's key, and freed with the last of them: nothing is leaked to get a
//! `&'static str` (issue 65, "one way to make a variant").

use std::fmt;
use std::hash::{Hash, Hasher};
use std::ops::Deref;
use std::sync::Arc;

/// Static or generated text. Equality and hashing are by the text alone, so a
/// generated copy of a file's text is the same key as the file's.
#[derive(Clone)]
pub enum Text {
    /// Compiled into the binary (a shader file, a fixed label).
    Static(&'static str),
    /// Built at run time for a variant, shared by its copies.
    Generated(Arc<str>),
}

impl Text {
    /// The text.
    pub fn as_str(&self) -> &str {
        match self {
            Text::Static(s) => s,
            Text::Generated(s) => s,
        }
    }
}

impl Deref for Text {
    type Target = str;
    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl From<String> for Text {
    fn from(text: String) -> Self {
        Text::Generated(text.into())
    }
}

impl From<&'static str> for Text {
    fn from(text: &'static str) -> Self {
        Text::Static(text)
    }
}

impl PartialEq for Text {
    fn eq(&self, other: &Self) -> bool {
        self.as_str() == other.as_str()
    }
}

impl Eq for Text {}

impl PartialEq<str> for Text {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for Text {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl Hash for Text {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.as_str().hash(state);
    }
}

impl fmt::Display for Text {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Debug for Text {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

#[cfg(test)]
mod tests {
    use super::Text;
    use std::collections::HashSet;

    #[test]
    fn a_generated_copy_of_a_static_text_is_the_same_key() {
        let text = "const BR: u32 = 64u;\n";
        let generated = Text::from(text.to_string());
        assert_eq!(Text::Static(text), generated);
        let keys: HashSet<Text> = [Text::Static(text), generated].into_iter().collect();
        assert_eq!(keys.len(), 1);
        assert_ne!(Text::Static(text), Text::from("const BR: u32 = 32u;\n".to_string()));
    }
}
