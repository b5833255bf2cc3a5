//! Chat messages to a prompt through the model's own template (`tokenizer.chat_template`, a
//! Jinja template as Hugging Face writes them), rendered with minijinja the way
//! `transformers`' `apply_chat_template` does: `messages`, `add_generation_prompt`,
//! `bos_token`, `eos_token`, and a `raise_exception` the templates call on bad input.

use minijinja::{context, Environment, Error, ErrorKind};
use serde::Serialize;

#[derive(Serialize)]
struct Message<'a> {
    role: &'a str,
    content: &'a str,
}

/// The prompt for `messages` (role, content) under `template`, ending where the assistant's
/// turn begins. The error is the template's message (a bad template, or one that refuses the
/// messages, e.g. roles out of order): the caller's 400.
pub fn render(
    template: &str,
    messages: &[(String, String)],
    bos: &str,
    eos: &str,
) -> Result<String, String> {
    let mut env = Environment::new();
    env.add_function("raise_exception", |msg: String| -> Result<String, Error> {
        Err(Error::new(ErrorKind::InvalidOperation, msg))
    });
    let t = env
        .template_from_str(template)
        .map_err(|e| format!("the model's chat template does not parse: {e}"))?;
    let messages: Vec<Message<'_>> = messages
        .iter()
        .map(|(role, content)| Message { role, content })
        .collect();
    t.render(context! {
        messages => messages,
        add_generation_prompt => true,
        bos_token => bos,
        eos_token => eos,
    })
    .map_err(|e| match e.kind() {
        ErrorKind::InvalidOperation => format!("the chat template refused the messages: {e}"),
        _ => format!("rendering the chat template: {e}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// SmolLM2-Instruct's template (ChatML with a default system turn), as its GGUF holds it.
    const SMOLLM2: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

    #[test]
    fn chatml_turns_with_the_generation_prompt() {
        let m = vec![("user".to_string(), "Hi?".to_string())];
        assert_eq!(
            render(SMOLLM2, &m, "<|im_start|>", "<|im_end|>").unwrap(),
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n\
             <|im_start|>user\nHi?<|im_end|>\n<|im_start|>assistant\n"
        );
        let m = vec![
            ("system".to_string(), "Be brief.".to_string()),
            ("user".to_string(), "Hi?".to_string()),
        ];
        assert_eq!(
            render(SMOLLM2, &m, "", "").unwrap(),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi?<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn template_errors_are_messages_not_panics() {
        let m = vec![("user".to_string(), "x".to_string())];
        let refusing = "{{ raise_exception('roles must alternate') }}";
        let e = render(refusing, &m, "", "").unwrap_err();
        assert!(e.contains("roles must alternate"), "{e}");
        assert!(render("{% for %}", &m, "", "").is_err());
        assert_eq!(
            render("{{ bos_token }}{{ messages[0].content }}", &m, "<s>", "").unwrap(),
            "<s>x"
        );
    }
}
