//! Upstream's capability rules (first match wins), matched on whole name tokens: a pattern
//! must equal a run of consecutive CamelCase/underscore tokens, so "Demonic" is not "omni" and
//! "Pixtral" is not "pix". The baseline matched substrings.

pub const TEXT_TO_TEXT: &str = "TEXT_TO_TEXT";
pub const IMAGE_TEXT_TO_TEXT: &str = "IMAGE_TEXT_TO_TEXT";
pub const EMBEDDING: &str = "EMBEDDING";
pub const AUDIO_TO_TEXT: &str = "AUDIO_TO_TEXT";
pub const TEXT_TO_AUDIO: &str = "TEXT_TO_AUDIO";
pub const IMAGE_TEXT_TO_AUDIO: &str = "IMAGE_TEXT_TO_AUDIO";
pub const VIDEO_TEXT_TO_AUDIO: &str = "VIDEO_TEXT_TO_AUDIO";
pub const AUDIO_TO_AUDIO: &str = "AUDIO_TO_AUDIO";
pub const TEXT_TO_IMAGE: &str = "TEXT_TO_IMAGE";
pub const IMAGE_TEXT_TO_IMAGE: &str = "IMAGE_TEXT_TO_IMAGE";
pub const TEXT_TO_VIDEO: &str = "TEXT_TO_VIDEO";
pub const IMAGE_TEXT_TO_VIDEO: &str = "IMAGE_TEXT_TO_VIDEO";

/// What the rules look at.
#[derive(Clone, Copy, Debug)]
pub struct Facts<'a> {
    pub architecture: &'a str,
    pub model_type: &'a str,
    /// `Some(has_pipeline)` for a model_index.json model.
    pub diffusion_pipeline: Option<bool>,
    pub has_vision: bool,
    pub is_embedding: bool,
}

/// Split a name into lower-case tokens: at non-alphanumerics, before an upper-case letter that
/// follows a lower-case letter or digit, and before the last capital of an acronym that starts
/// a word ("XLPipeline" → xl, pipeline). Digits stay with the letters before them ("Wav2Vec2").
pub fn tokens(name: &str) -> Vec<String> {
    let chars: Vec<char> = name.chars().collect();
    let mut out: Vec<String> = Vec::new();
    let mut current = String::new();
    for (i, &c) in chars.iter().enumerate() {
        if !c.is_ascii_alphanumeric() {
            push_token(&mut out, &mut current);
            continue;
        }
        let prev = i.checked_sub(1).map(|j| chars[j]);
        let next = chars.get(i + 1).copied();
        let after_lower_or_digit = prev.is_some_and(|p| p.is_ascii_lowercase() || p.is_ascii_digit());
        let acronym_end = prev.is_some_and(|p| p.is_ascii_uppercase()) && next.is_some_and(|n| n.is_ascii_lowercase());
        if c.is_ascii_uppercase() && (after_lower_or_digit || acronym_end) {
            push_token(&mut out, &mut current);
        }
        current.push(c.to_ascii_lowercase());
    }
    push_token(&mut out, &mut current);
    out
}

fn push_token(out: &mut Vec<String>, current: &mut String) {
    if !current.is_empty() {
        out.push(std::mem::take(current));
    }
}

/// Does `pattern` (separators ignored) equal a run of consecutive tokens of `name`?
pub fn has_token_run(name: &str, pattern: &str) -> bool {
    let pattern: String = pattern.chars().filter(|c| c.is_ascii_alphanumeric()).collect::<String>().to_lowercase();
    let toks = tokens(name);
    (0..toks.len()).any(|start| {
        let mut run = String::new();
        toks[start..].iter().any(|t| {
            run.push_str(t);
            run == pattern
        })
    })
}

fn any_run(name: &str, patterns: &[&str]) -> bool {
    patterns.iter().any(|p| has_token_run(name, p))
}

/// Model types of the BERT family ("bert", "roberta", "xlm-roberta", "distilbert", ...): the
/// baseline's substring "bert" meant them, so a token ending in "bert"/"berta" keeps them while
/// "Libertas" and the like stay out.
fn is_bert_family(model_type: &str) -> bool {
    tokens(model_type).iter().any(|t| t.ends_with("bert") || t.ends_with("berta"))
}

pub fn capabilities(f: &Facts) -> Vec<&'static str> {
    if let Some(has_pipeline) = f.diffusion_pipeline {
        if !has_pipeline {
            return vec![];
        }
        if let Some(c) = diffusion_capability(f.architecture) {
            return vec![c];
        }
    }
    if has_token_run(f.model_type, "nemotronh_nano") {
        return vec![IMAGE_TEXT_TO_TEXT, TEXT_TO_TEXT, AUDIO_TO_TEXT];
    }
    if f.has_vision {
        return vec![IMAGE_TEXT_TO_TEXT];
    }
    if has_token_run(f.architecture, "omni") {
        return vec![TEXT_TO_AUDIO, IMAGE_TEXT_TO_AUDIO, VIDEO_TEXT_TO_AUDIO, AUDIO_TO_TEXT, AUDIO_TO_AUDIO];
    }
    if any_run(f.architecture, &["whisper", "wav2vec2", "hubert", "fortc", "forspeechtotext"]) {
        return vec![AUDIO_TO_TEXT];
    }
    let mistral_model = has_token_run(f.model_type, "mistral") && has_token_run(f.architecture, "mistralmodel");
    if f.is_embedding
        || any_run(f.architecture, &["embedding", "sentence"])
        || is_bert_family(f.model_type)
        || mistral_model
    {
        return vec![EMBEDDING];
    }
    vec![TEXT_TO_TEXT]
}

fn diffusion_capability(architecture: &str) -> Option<&'static str> {
    if any_run(architecture, &["imageedit", "pix2pix", "img2img", "inpaint"]) {
        Some(IMAGE_TEXT_TO_IMAGE)
    } else if any_run(architecture, &["image", "pix", "stablediffusion"]) {
        Some(TEXT_TO_IMAGE)
    } else if any_run(architecture, &["texttovideo", "t2v"]) {
        Some(TEXT_TO_VIDEO)
    } else if any_run(architecture, &["video"]) {
        Some(IMAGE_TEXT_TO_VIDEO)
    } else {
        None
    }
}
